"""Batch reads: slicing returns every record exactly once; committed work is skipped."""

from __future__ import annotations

from typing import Any

import pytest

from client.http import CoordinatorClient, PartitionCommit
from client.protocol.committed import Watermark
from client.protocol.keyspace import KeyRange, key_hash
from tests.fixtures.services import MakeTopic
from tests.spark.conftest import (
    in_spark_thread,
    keyed_record,
    log_ends,
    produce,
    read_all,
    stable_offsets,
)

pytestmark = pytest.mark.spark

PARTITIONS = 2


def _read(spark: Any, **options: str) -> Any:
    reader = spark.read.format("keyrange")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.mark.parametrize("slice_by", ["keys", "offsets"])
async def test_four_slices_per_partition_return_every_record_exactly_once(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic, slice_by: str
) -> None:
    from pyspark.sql import functions as F

    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 300)
    frame = _read(
        spark,
        bootstrap=kafka_bootstrap,
        topics=topic,
        slices_per_partition="4",
        slice_by=slice_by,
        includeHeaders="true",
    )

    def collect() -> tuple[int, list[Any]]:
        tagged = frame.withColumn("task", F.spark_partition_id())
        return frame.rdd.getNumPartitions(), tagged.collect()

    tasks, rows = await in_spark_thread(spark, collect)

    assert tasks == 4 * PARTITIONS
    assert sorted((row.partition, row.offset) for row in rows) == sorted(produced)
    for row in rows:
        index = int(row.value)
        assert (row.key, row.value) == keyed_record(index)
        assert [(header.key, header.value) for header in row.headers] == [("index", row.value)]
    if slice_by == "keys":
        # Per-key work without a shuffle: each key's records sit in one task, in offset order.
        tasks_of_key: dict[tuple[int, int], set[int]] = {}
        offsets_in_task: dict[int, list[int]] = {}
        for row in rows:
            hash_value = key_hash(row.key, row.offset)
            tasks_of_key.setdefault((row.partition, hash_value), set()).add(row.task)
            offsets_in_task.setdefault(row.task, []).append(row.offset)
        assert all(len(tasks) == 1 for tasks in tasks_of_key.values())
        assert all(offsets == sorted(offsets) for offsets in offsets_in_task.values())


@pytest.mark.parametrize("slice_by", ["keys", "offsets"])
async def test_batch_read_skips_committed_work_and_commit_moves_the_stable_offset_to_the_end(
    spark: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    slice_by: str,
) -> None:
    from client.spark import plan_batch_read

    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 200)
    lower_half = KeyRange(0, 2**62 - 1)
    async with CoordinatorClient(coordinator_url) as api:
        # Partition 0: offsets 0..19 done, 30..39 done, lower-half keys done below 60.
        # Partition 1: never committed.
        await api.commit(
            group,
            [
                PartitionCommit(
                    topic,
                    0,
                    ranges=((0, 19), (30, 39)),
                    watermarks=(Watermark(lower_half, 60),),
                )
            ],
        )
    options = {
        "bootstrap": kafka_bootstrap,
        "topics": topic,
        "coordinator": coordinator_url,
        "group": group,
        "slices_per_partition": "3",
        "slice_by": slice_by,
    }
    batch = await in_spark_thread(spark, lambda: plan_batch_read(options))
    rows = await in_spark_thread(spark, lambda: batch.load(spark).collect())

    def processed_before(partition: int, offset: int, key: bytes | None) -> bool:
        if partition != 0:
            return False
        in_lower_half = lower_half.contains(key_hash(key, offset))
        return offset < 20 or 30 <= offset <= 39 or (in_lower_half and offset < 60)

    expected = sorted(
        (partition, offset)
        for partition, offset in produced
        if not processed_before(partition, offset, keyed_record(_index(partition, offset))[0])
    )
    assert sorted((row.partition, row.offset) for row in rows) == expected

    await in_spark_thread(spark, batch.commit)
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)
    again = await in_spark_thread(spark, lambda: plan_batch_read(options).load(spark).count())
    assert again == 0


def _index(partition: int, offset: int) -> int:
    """``produce`` sends record i to partition i % PARTITIONS, in order."""
    return offset * PARTITIONS + partition


async def test_sink_writes_key_value_and_headers_of_every_row(
    spark: Any, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    output = await make_topic(1)
    rows = [
        (f"k{index}".encode(), f"v{index}".encode(), [("h", f"{index}".encode())])
        for index in range(50)
    ]

    def write() -> None:
        frame = spark.createDataFrame(
            rows, "key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
        )
        frame.write.format("keyrange").option("bootstrap", kafka_bootstrap).option(
            "topic", output
        ).mode("append").save()

    await in_spark_thread(spark, write)
    written = await read_all(kafka_bootstrap, output, 1, expected=len(rows))
    assert sorted((r.key, r.value, list(r.headers)) for r in written) == sorted(
        (key, value, headers) for key, value, headers in rows
    )
