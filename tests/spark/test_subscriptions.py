"""Spark's ways to choose what a read covers, against the embedded broker:
``subscribePattern`` (RE2, whole names), ``assign``, ``minPartitions`` mapped onto slices,
and offsets by record timestamp where the broker answers them."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from coordinator.kafka import ClusterMetadata
from tests.fixtures.services import MakeTopic
from tests.spark.conftest import in_spark_thread, produce

pytestmark = pytest.mark.spark

BASE_MS = 1_700_000_000_000


def _load(spark: Any, options: dict[str, str]) -> Any:
    return spark.read.format("keyrange").options(**options).load()


async def test_a_pattern_reads_every_matching_topic_and_assign_only_its_partitions(
    spark: Any, kafka_bootstrap: str, cluster_metadata: ClusterMetadata
) -> None:
    prefix = f"orders-{uuid.uuid4().hex[:8]}"
    first, second, other = f"{prefix}-eu", f"{prefix}-us", f"x{prefix}-eu"
    for topic, partitions in ((first, 2), (second, 1), (other, 1)):
        await cluster_metadata.create_topic(topic, partitions)
        await produce(kafka_bootstrap, topic, partitions, 0, 10)
    bootstrap = {"kafka.bootstrap.servers": kafka_bootstrap}

    def read() -> tuple[list[Any], list[Any], int]:
        pattern = _load(spark, {**bootstrap, "subscribePattern": f"{prefix}-.*"})
        assigned = _load(spark, {**bootstrap, "assign": json.dumps({first: [1]})})
        split = _load(spark, {**bootstrap, "subscribe": first, "minPartitions": "6"})
        return (
            pattern.select("topic", "partition").collect(),
            assigned.select("topic", "partition").collect(),
            split.rdd.getNumPartitions(),
        )

    matched, assigned, tasks = await in_spark_thread(spark, read)
    assert sorted({(row.topic, row.partition) for row in matched}) == [
        (first, 0),
        (first, 1),
        (second, 0),
    ]
    assert len(matched) == 20
    assert {(row.topic, row.partition) for row in assigned} == {(first, 1)}
    assert len(assigned) == 5
    assert tasks == 6


async def test_offsets_by_timestamp_are_refused_where_the_broker_answers_them_wrong(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for index in range(20):
            await producer.send_and_wait(
                topic, f"{index}".encode(), partition=0, timestamp_ms=BASE_MS + index * 1000
            )
    finally:
        await producer.stop()
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "subscribe": topic,
        "startingOffsetsByTimestamp": json.dumps({topic: {"0": BASE_MS + 4500}}),
        "endingTimestamp": str(BASE_MS + 15_000),
    }

    def read() -> list[Any]:
        return _load(spark, options).select("offset").collect()

    # The embedded broker answers every ListOffsets by timestamp with offset 0; the source
    # checks the answer against the record and refuses rather than read the wrong records.
    with pytest.raises(Exception, match="does not answer ListOffsets by timestamp"):
        await in_spark_thread(spark, read)
