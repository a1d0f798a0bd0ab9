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


async def test_an_explicit_earliest_reads_every_record_as_sparks_source_does(
    spark: Any, kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, group: str
) -> None:
    """With ``group`` set, ``startingOffsets=earliest`` read only what the group had not
    processed (issue 47 item 5: 100 of 500 rows); Spark's meaning is every record from the
    start. Unset, the group's progress still applies, and ``skip_processed`` overrides both."""
    from client.spark import plan_batch_read

    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, 1, 0, RECORDS)
    options = _options(kafka_bootstrap, coordinator_url, group, topic)
    first_part = {**options, "ending_offsets": json.dumps({topic: {"0": 40}})}

    def offsets_read(read_options: dict[str, str], commit: bool = False) -> list[int]:
        batch = plan_batch_read(read_options)
        offsets = sorted(row.offset for row in batch.load(spark).collect())
        if commit:
            batch.commit()
        return offsets

    def direct_read(read_options: dict[str, str]) -> list[int]:
        frame = spark.read.format("keyrange").options(**read_options).load()
        return sorted(row.offset for row in frame.collect())

    assert await in_spark_thread(spark, lambda: offsets_read(first_part, commit=True)) == list(
        range(40)
    )
    earliest = {**options, "startingOffsets": "earliest"}
    assert await in_spark_thread(spark, lambda: offsets_read(earliest)) == list(range(RECORDS))
    assert await in_spark_thread(spark, lambda: direct_read(earliest)) == list(range(RECORDS))
    assert await in_spark_thread(spark, lambda: offsets_read(options)) == list(range(40, RECORDS))
    skipping = {**earliest, "skip_processed": "true"}
    assert await in_spark_thread(spark, lambda: offsets_read(skipping)) == list(range(40, RECORDS))


async def test_a_batch_read_with_a_group_says_at_planning_that_it_reports_nothing(
    spark: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from client.spark.options import parse_source_options
    from client.spark.source import KeyrangeBatchReader, plan_batch_read

    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, 1, 0, 10)
    options = _options(kafka_bootstrap, coordinator_url, group, topic)
    caplog.set_level("WARNING", logger="client.spark.source")

    def plan(read_options: dict[str, str]) -> None:
        KeyrangeBatchReader(parse_source_options(read_options)).partitions()

    await in_spark_thread(spark, lambda: plan(options))
    warned = [r.getMessage() for r in caplog.records if r.name == "client.spark.source"]
    assert len(warned) == 1 and "reports nothing to group" in warned[0]
    assert "plan_batch_read" in warned[0]
    caplog.clear()
    await in_spark_thread(spark, lambda: plan(plan_batch_read(options).options))
    assert not [r for r in caplog.records if r.name == "client.spark.source"]
