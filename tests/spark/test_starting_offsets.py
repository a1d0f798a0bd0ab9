"""What a report claims when a job starts a partition the group never committed at an
explicit offset: only what it read, never the records before the offset (docs/spark.md,
"Starting offsets and what a report claims")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from client.http import CoordinatorClient
from client.protocol.keyspace import key_hash
from tests.fixtures.services import MakeTopic
from tests.spark.conftest import in_spark_thread, keyed_record, produce

pytestmark = pytest.mark.spark

RECORDS = 60
ORIGIN = 20


def _options(bootstrap: str, coordinator_url: str, group: str, topic: str) -> dict[str, str]:
    return {
        "bootstrap": bootstrap,
        "topics": topic,
        "coordinator": coordinator_url,
        "group": group,
        "slices_per_partition": "2",
        "slice_by": "keys",
    }


async def _assert_only_the_read_records_are_claimed(
    spark: Any, coordinator_url: str, group: str, topic: str, options: dict[str, str]
) -> None:
    async with CoordinatorClient(coordinator_url) as api:
        state = (await api.fetch_offsets(group, topics=[topic]))[TopicPartition(topic, 0)]
    unread_claimed = [
        offset
        for offset in range(ORIGIN)
        if state.is_processed(offset, key_hash(keyed_record(offset)[0], offset))
    ]
    read_unclaimed = [
        offset
        for offset in range(ORIGIN, RECORDS)
        if not state.is_processed(offset, key_hash(keyed_record(offset)[0], offset))
    ]
    assert (state.stable_offset, unread_claimed, read_unclaimed) == (0, [], [])
    # What every other reader of the group sees: the records before the origin are still due.
    from client.spark import plan_batch_read

    def read_from_committed() -> list[int]:
        batch = plan_batch_read(options)
        return sorted(row.offset for row in batch.load(spark).collect())

    assert await in_spark_thread(spark, read_from_committed) == list(range(ORIGIN))


async def test_a_batch_read_from_an_explicit_offset_claims_only_what_it_read(
    spark: Any, kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, group: str
) -> None:
    from client.spark import plan_batch_read

    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, 1, 0, RECORDS)
    options = _options(kafka_bootstrap, coordinator_url, group, topic)
    explicit = {**options, "starting_offsets": json.dumps({topic: {"0": ORIGIN}})}

    def read_and_commit() -> list[int]:
        batch = plan_batch_read(explicit)
        offsets = sorted(row.offset for row in batch.load(spark).collect())
        batch.commit()
        return offsets

    assert await in_spark_thread(spark, read_and_commit) == list(range(ORIGIN, RECORDS))
    await _assert_only_the_read_records_are_claimed(spark, coordinator_url, group, topic, options)


async def test_a_stream_from_an_explicit_offset_claims_only_what_it_read(
    spark: Any,
    committer: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, 1, 0, RECORDS)
    options = _options(kafka_bootstrap, coordinator_url, group, topic)
    delivered: list[int] = []

    def write(batch: Any, batch_id: int) -> None:
        delivered.extend(row.offset for row in batch.collect())

    def run() -> None:
        reader = spark.readStream.format("keyrange")
        for name, value in options.items():
            reader = reader.option(name, value)
        query = (
            reader.option("starting_offsets", json.dumps({topic: {"0": ORIGIN}}))
            .option("max_records_per_trigger", "25")
            .load()
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        committer.await_query(query)

    await in_spark_thread(spark, run)
    assert sorted(delivered) == list(range(ORIGIN, RECORDS))
    await _assert_only_the_read_records_are_claimed(spark, coordinator_url, group, topic, options)
