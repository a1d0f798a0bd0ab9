"""Spark running a slice twice: a retried task reads its slice again and its rows reach user
code again, but the batch is reported once, by the driver, after Spark committed it; a session
with speculative execution is refused unless allowed (docs/spark.md, "Task retries and
speculative execution")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import TopicPartition
from prometheus_client import REGISTRY

from client.http import CoordinatorClient
from tests.fixtures.services import MakeTopic
from tests.spark.conftest import in_spark_thread, produce

pytestmark = pytest.mark.spark

RECORDS = 60
FAIL_AFTER = 5


def _noting_udf(marker_dir: str) -> Any:
    """The identity on ``offset``, which notes every call by task and attempt, and fails
    the first attempt of task 0 after ``FAIL_AFTER`` rows."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    def note(offset: int) -> int:
        context = TaskContext.get()
        assert context is not None
        path = Path(marker_dir) / f"{context.partitionId()}-{context.attemptNumber()}"
        with path.open("a") as notes:
            notes.write(f"{offset}\n")
        seen = len(path.read_text().split())
        if context.partitionId() == 0 and context.attemptNumber() == 0 and seen >= FAIL_AFTER:
            raise RuntimeError("first attempt of task 0 fails")
        return offset

    return F.udf(note, "bigint", useArrow=False)


def _commit_requests() -> float:
    return REGISTRY.get_sample_value("keyrange_commits_total") or 0.0


def _notes(marker_dir: Path) -> dict[str, list[int]]:
    return {
        path.name: [int(line) for line in path.read_text().split()]
        for path in sorted(marker_dir.iterdir())
    }


async def test_a_retried_task_reads_its_slice_again_and_the_batch_is_reported_once(
    spark: Any,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    group: str,
    tmp_path: Path,
) -> None:
    from pyspark.sql import functions as F

    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, 1, 0, RECORDS)
    markers = tmp_path / "markers"
    markers.mkdir()
    checkpoint = tmp_path / "checkpoint"
    delivered: list[int] = []

    def write(batch: Any, batch_id: int) -> None:
        delivered.extend(row.offset for row in batch.collect())

    def run() -> None:
        query = (
            spark.readStream.format("keyrange")
            .option("bootstrap", kafka_bootstrap)
            .option("topics", topic)
            .option("coordinator", coordinator_url)
            .option("group", group)
            .option("slices_per_partition", "2")
            .option("slice_by", "keys")
            .load()
            .select(_noting_udf(str(markers))(F.col("offset")).alias("offset"))
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    # The coordinator serves from this process: its counter sees every report, whoever sends it.
    commits_before = _commit_requests()
    await in_spark_thread(spark, run)
    commits = _commit_requests() - commits_before

    notes = _notes(markers)
    # Task 0 ran twice: its first attempt saw FAIL_AFTER rows, which its retry read again
    # from Kafka and passed to the UDF again (at least once); task 1 ran once.
    assert sorted(notes) == ["0-0", "0-1", "1-0"]
    assert len(notes["0-0"]) == FAIL_AFTER
    assert set(notes["0-0"]) <= set(notes["0-1"])
    assert sorted(notes["0-1"] + notes["1-0"]) == list(range(RECORDS))
    # Spark keeps the successful attempt's rows only.
    assert sorted(delivered) == list(range(RECORDS))
    batches = [path for path in (checkpoint / "commits").iterdir() if path.name.isdigit()]
    assert commits == len(batches) == 1
    async with CoordinatorClient(coordinator_url) as api:
        state = (await api.fetch_offsets(group, topics=[topic]))[TopicPartition(topic, 0)]
    assert (state.stable_offset, state.ranges) == (RECORDS, ())


_SPECULATIVE_SESSION = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
from client.spark import SpeculationRefused, register
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.speculation", "true").getOrCreate())
try:
    register(spark)
except SpeculationRefused:
    print("refused")
register(spark, allow_speculation=True)
print(spark.read.format("keyrange").option("bootstrap", "unused:9092")
      .option("topics", "t").load().columns[0])
spark.stop()
"""


def test_a_session_with_speculation_is_refused_unless_allowed(spark: Any) -> None:
    """In a session of its own: Spark fixes ``spark.speculation`` when a session starts.

    Uses the ``spark`` fixture only to skip where Java is missing.
    """
    result = subprocess.run(
        [sys.executable, "-c", _SPECULATIVE_SESSION],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=300,
        check=False,
    )
    assert result.stdout.split() == ["refused", "key"], result.stderr[-2000:]
