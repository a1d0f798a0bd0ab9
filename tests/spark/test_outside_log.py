"""The Spark source and a position past the partition's log end (a broker that lost its data):
the group's stored offset, or a stream's checkpoint, is reset by ``auto_offset_reset`` and the
records in the log are read, never skipped as "nothing to do"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from client.http import CoordinatorClient, PartitionCommit
from client.spark.options import OptionError, parse_source_options
from tests.fixtures.services import MakeTopic
from tests.spark.conftest import in_spark_thread, log_ends, produce, stable_offsets

pytestmark = pytest.mark.spark

PARTITIONS = 2
PAST_THE_END = 2_000


async def _store_past_the_end(coordinator_url: str, group: str, topic: str) -> None:
    async with CoordinatorClient(coordinator_url) as api:
        await api.commit(
            group, [PartitionCommit(topic, p, offset=PAST_THE_END) for p in range(PARTITIONS)]
        )


def _options(bootstrap: str, coordinator_url: str, group: str, topic: str) -> dict[str, str]:
    return {"bootstrap": bootstrap, "topics": topic, "coordinator": coordinator_url, "group": group}


async def test_a_batch_read_resets_a_stored_offset_past_the_end_and_reads_the_log(
    spark: Any, kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, group: str
) -> None:
    from client.spark import plan_batch_read

    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 80)
    await _store_past_the_end(coordinator_url, group, topic)
    options = _options(kafka_bootstrap, coordinator_url, group, topic)
    batch = await in_spark_thread(spark, lambda: plan_batch_read(options))
    rows = await in_spark_thread(spark, lambda: batch.load(spark).collect())
    assert sorted((row.partition, row.offset) for row in rows) == sorted(produced)
    await in_spark_thread(spark, batch.commit)
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)


async def test_a_stream_reads_the_log_under_a_stored_offset_past_the_end(
    spark: Any,
    committer: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 80)
    await _store_past_the_end(coordinator_url, group, topic)
    delivered = await _run_stream(
        spark, committer, kafka_bootstrap, coordinator_url, group, topic, tmp_path
    )
    assert sorted(delivered) == sorted(produced)
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)


async def test_a_stream_checkpoint_past_the_end_restarts_from_the_log_start(
    spark: Any,
    committer: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(PARTITIONS)
    produced = await produce(kafka_bootstrap, topic, PARTITIONS, 0, 40)
    first = await _run_stream(
        spark, committer, kafka_bootstrap, coordinator_url, group, topic, tmp_path
    )
    # What a broker restart leaves behind: a checkpoint whose positions the log no longer has.
    _move_checkpoint_past_the_end(tmp_path / "checkpoint")
    more = await produce(kafka_bootstrap, topic, PARTITIONS, 40, 20)
    second = await _run_stream(
        spark, committer, kafka_bootstrap, coordinator_url, group, topic, tmp_path
    )
    # Restarted at the log start, the stream still skips what the group processed before.
    assert sorted(first) == sorted(produced)
    assert sorted(second) == sorted(more)
    produced += more
    assert await stable_offsets(coordinator_url, group, topic) == log_ends(produced)


async def test_fail_on_data_loss_fails_a_read_whose_stored_offset_is_past_the_end(
    spark: Any, kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, group: str
) -> None:
    from client.errors import OffsetOutOfRange
    from client.spark import plan_batch_read

    topic = await make_topic(PARTITIONS)
    await produce(kafka_bootstrap, topic, PARTITIONS, 0, 20)
    await _store_past_the_end(coordinator_url, group, topic)
    options = {**_options(kafka_bootstrap, coordinator_url, group, topic), "failOnDataLoss": "true"}
    with pytest.raises(OffsetOutOfRange, match=r"past its log end.*failOnDataLoss is true"):
        await in_spark_thread(spark, lambda: plan_batch_read(options))
    # Nothing was moved: the group still says where it was.
    assert set((await stable_offsets(coordinator_url, group, topic)).values()) == {PAST_THE_END}


def test_the_reset_policy_is_checked_when_the_options_are_parsed() -> None:
    options = {"bootstrap": "b:9092", "topics": "t", "auto_offset_reset": "latest"}
    assert parse_source_options(options).auto_offset_reset == "latest"
    with pytest.raises(OptionError, match="auto_offset_reset"):
        parse_source_options({**options, "auto_offset_reset": "smallest"})


async def _run_stream(
    spark: Any,
    committer: Any,
    bootstrap: str,
    coordinator_url: str,
    group: str,
    topic: str,
    tmp_path: Path,
) -> list[tuple[int, int]]:
    delivered: list[tuple[int, int]] = []

    def write(batch: Any, batch_id: int) -> None:
        delivered.extend((row.partition, row.offset) for row in batch.collect())

    def run() -> None:
        reader = spark.readStream.format("keyrange")
        for name, value in _options(bootstrap, coordinator_url, group, topic).items():
            reader = reader.option(name, value)
        query = (
            reader.load()
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        committer.await_query(query)

    await in_spark_thread(spark, run)
    return delivered


def _move_checkpoint_past_the_end(checkpoint: Path) -> None:
    last = max(int(path.name) for path in (checkpoint / "offsets").iterdir() if path.name.isdigit())
    path = checkpoint / "offsets" / str(last)
    lines = path.read_text().splitlines()
    document = json.loads(lines[-1])
    for partitions in document["partitions"].values():
        for partition in partitions:
            partitions[partition] = [PAST_THE_END - 100, PAST_THE_END]
    lines[-1] = json.dumps(document)
    path.write_text("\n".join(lines))
