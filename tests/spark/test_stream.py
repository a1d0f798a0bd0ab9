"""Streaming reads: availableNow runs, checkpoint restarts, reports after finished batches."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import MakeTopic
from tests.spark.conftest import in_spark_thread, log_ends, produce, read_all, stable_offsets

pytestmark = pytest.mark.spark

PARTITIONS = 2


def _stream(spark: Any, bootstrap: str, coordinator_url: str, group: str, topic: str) -> Any:
    return (
        spark.readStream.format("keyrange")
        .option("bootstrap", bootstrap)
        .option("topics", topic)
        .option("coordinator", coordinator_url)
        .option("group", group)
        .option("slices_per_partition", "2")
        .option("slice_by", "keys")
        # Several batches per run, so batch boundaries and their reports are exercised.
        .option("max_records_per_trigger", "70")
        .load()
    )


def _to_kafka(
    spark: Any,
    bootstrap: str,
    coordinator_url: str,
    group: str,
    topic: str,
    output: str,
    checkpoint: Path,
) -> Any:
    from pyspark.sql import functions as F

    rows = _stream(spark, bootstrap, coordinator_url, group, topic).select(
        F.col("key"),
        F.concat_ws(":", F.col("partition"), F.col("offset")).alias("value"),
    )
    return (
        rows.writeStream.format("keyrange")
        .option("bootstrap", bootstrap)
        .option("topic", output)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


async def test_available_now_twice_processes_each_record_once_and_commits_to_the_end(
    spark: Any,
    committer: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(PARTITIONS)
    output = await make_topic(1)
    checkpoint = tmp_path / "checkpoint"
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 200)

    def run() -> None:
        query = _to_kafka(spark, kafka_bootstrap, coordinator_url, group, topic, output, checkpoint)
        committer.await_query(query)

    await in_spark_thread(spark, run)
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)

    produced += await produce(kafka_bootstrap, topic, PARTITIONS, 200, 150)
    await in_spark_thread(spark, run)
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)

    written = await read_all(kafka_bootstrap, output, 1, expected=len(produced))
    seen = sorted(tuple(int(part) for part in r.value.decode().split(":")) for r in written)
    assert seen == sorted(produced)


async def test_failed_batch_commits_nothing_and_the_rerun_completes(
    spark: Any,
    committer: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    from pyspark.errors import StreamingQueryException

    topic = await make_topic(PARTITIONS)
    checkpoint = tmp_path / "checkpoint"
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 140)
    delivered: list[tuple[int, int]] = []

    def sink(fail_from_batch: int | None) -> Any:
        def write(batch: Any, batch_id: int) -> None:
            if fail_from_batch is not None and batch_id >= fail_from_batch:
                raise RuntimeError(f"sink failure in batch {batch_id}")
            delivered.extend((row.partition, row.offset) for row in batch.collect())

        return write

    def run(fail_from_batch: int | None) -> Any:
        query = (
            _stream(spark, kafka_bootstrap, coordinator_url, group, topic)
            .writeStream.foreachBatch(sink(fail_from_batch))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        committer.await_query(query)
        return query

    with pytest.raises(StreamingQueryException, match="sink failure in batch 1"):
        await in_spark_thread(spark, lambda: run(1))
    first_batch_end = {
        int(partition): pair[1]
        for partition, pair in json.loads(_last_end_offset(checkpoint))["partitions"][topic].items()
    }
    assert 0 < sum(first_batch_end.values()) < len(produced)
    assert await stable_offsets(coordinator_url, group, topic) == first_batch_end

    await in_spark_thread(spark, lambda: run(None))
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)
    assert sorted(delivered) == sorted(produced)


def _last_end_offset(checkpoint: Path) -> str:
    """The source offset of the last batch Spark committed, from its checkpoint."""
    committed = max(
        int(path.name) for path in (checkpoint / "commits").iterdir() if path.name.isdigit()
    )
    lines = (checkpoint / "offsets" / str(committed)).read_text().splitlines()
    return lines[-1]


async def test_processing_time_trigger_reads_new_records_as_they_arrive(
    spark: Any,
    committer: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 60)
    delivered: list[tuple[int, int]] = []

    def write(batch: Any, batch_id: int) -> None:
        delivered.extend((row.partition, row.offset) for row in batch.collect())

    def start() -> Any:
        return (
            _stream(spark, kafka_bootstrap, coordinator_url, group, topic)
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )

    query = await in_spark_thread(spark, start)
    try:
        await _until(lambda: len(delivered) >= len(produced))
        produced += await produce(kafka_bootstrap, topic, PARTITIONS, 60, 60)
        await _until(lambda: len(delivered) >= len(produced))
        # A batch is reported once Spark has committed it, a moment after its rows were
        # delivered; stopping before that leaves it to be re-run, and unreported.
        await _until_reported(coordinator_url, group, topic, log_ends(produced))
    finally:

        def stop() -> None:
            query.stop()
            committer.await_query(query)

        # Stopping waits for a batch being planned, which may be calling the coordinator.
        await in_spark_thread(spark, stop)
    assert sorted(delivered) == sorted(produced)
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)


async def _until_reported(
    coordinator_url: str, group: str, topic: str, expected: dict[int, int], timeout_s: float = 60.0
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await stable_offsets(coordinator_url, group, topic) != expected:
        assert asyncio.get_running_loop().time() < deadline, "batches not reported in time"
        await asyncio.sleep(0.2)


async def _until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting for the stream"
        await asyncio.sleep(0.2)
