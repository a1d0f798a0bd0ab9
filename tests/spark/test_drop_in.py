"""The proof of issue 32: one pipeline written exactly as for Spark's Kafka source — same
options, same column expressions — runs on ``keyrange`` with only the format name changed
and the coordinator and group added, in batch and in streaming (``availableNow`` and a
processing-time trigger), and the group's committed offsets follow with no ceremony."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import MakeTopic
from tests.spark.conftest import (
    in_spark_thread,
    keyed_record,
    log_ends,
    produce,
    stable_offsets,
)
from tests.waiting import until

pytestmark = pytest.mark.spark

PARTITIONS = 2
# Spark's Kafka source's schema with includeHeaders=true (KafkaRecordToRowConverter).
SPARK_KAFKA_SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "timestamp TIMESTAMP, timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
)


def kafka_options(bootstrap: str, topic: str) -> dict[str, str]:
    """What a Spark pipeline passes to ``format("kafka")``."""
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "includeHeaders": "true",
        "kafka.request.timeout.ms": "20000",
        "kafka.isolation.level": "read_uncommitted",
    }


def pipeline(frame: Any) -> Any:
    """The pipeline's column expressions, as written against Spark's Kafka source."""
    return frame.selectExpr(
        "CAST(key AS STRING) AS user",
        "CAST(value AS STRING) AS amount",
        "topic",
        "partition",
        "offset",
        "timestampType",
        "CAST(timestamp AS LONG) > 0 AS stamped",
        "headers[0].key AS header",
    )


def check_rows(rows: list[Any], produced: list[tuple[int, int]]) -> None:
    assert sorted((row.partition, row.offset) for row in rows) == sorted(produced)
    for row in rows:
        key, value = keyed_record(int(row.amount))
        assert (row.user, row.amount) == (key and key.decode(), value.decode())
        assert (row.timestampType, row.stamped, row.header) == (0, True, "index")


async def test_a_batch_pipeline_ports_with_the_format_name_and_two_options(
    spark: Any, kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, group: str
) -> None:
    from pyspark.sql.types import _parse_datatype_string

    from client.spark import plan_batch_read

    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 120)
    options = {
        **kafka_options(kafka_bootstrap, topic),
        "endingOffsets": "latest",
        "coordinator": coordinator_url,
        "group": group,
    }

    def read() -> tuple[Any, list[Any]]:
        frame = spark.read.format("keyrange").options(**options).load()
        return frame.schema, pipeline(frame).collect()

    schema, rows = await in_spark_thread(spark, read)
    assert schema == _parse_datatype_string(SPARK_KAFKA_SCHEMA)
    check_rows(rows, produced)
    # A plain read claims nothing; a pinned one reports once its output is safe.
    assert await stable_offsets(coordinator_url, group, topic) == {}
    batch = await in_spark_thread(spark, lambda: plan_batch_read(options))
    check_rows(
        await in_spark_thread(spark, lambda: pipeline(batch.load(spark)).collect()), produced
    )
    await in_spark_thread(spark, batch.commit)
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)


async def test_an_available_now_pipeline_commits_without_ceremony(
    spark: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 150)
    delivered: list[Any] = []
    options = {
        **kafka_options(kafka_bootstrap, topic),
        "maxOffsetsPerTrigger": "70",
        "coordinator": coordinator_url,
        "group": group,
    }

    def run() -> None:
        frame = spark.readStream.format("keyrange").options(**options).load()
        query = (
            pipeline(frame)
            .writeStream.foreachBatch(lambda batch, _: delivered.extend(batch.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    await in_spark_thread(spark, run)
    # Read right after awaitTermination: the last batch is reported before it returns.
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)
    produced += await produce(kafka_bootstrap, topic, PARTITIONS, 150, 50)
    await in_spark_thread(spark, run)
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)
    check_rows(delivered, produced)


async def test_a_processing_time_pipeline_commits_without_ceremony(
    spark: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 60)
    delivered: list[Any] = []
    options = {
        **kafka_options(kafka_bootstrap, topic),
        "coordinator": coordinator_url,
        "group": group,
    }

    def start() -> Any:
        frame = spark.readStream.format("keyrange").options(**options).load()
        return (
            pipeline(frame)
            .writeStream.foreachBatch(lambda batch, _: delivered.extend(batch.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )

    query = await in_spark_thread(spark, start)
    try:
        await until(lambda: len(delivered) >= len(produced), 60, "the first records")
        produced += await produce(kafka_bootstrap, topic, PARTITIONS, 60, 60)
        await until(lambda: len(delivered) >= len(produced), 60, "the later records")
        ends = log_ends(produced)

        async def reported() -> bool:
            return await stable_offsets(coordinator_url, group, topic) == ends

        # A batch is reported at the trigger after Spark committed it.
        await until(reported, 60, "the batches' reports")
    finally:
        await in_spark_thread(spark, query.stop)
    check_rows(delivered, produced)
