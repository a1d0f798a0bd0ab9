"""One local SparkSession for the whole test session, and helpers for keyed topics.

Spark's JVM takes seconds to start, so every Spark test shares one session (local[2,2]: two
cores, and a failed task is tried twice, as a cluster retries it, where plain local[2] gives
up at once; no UI, two shuffle partitions). Without Java the Spark tests skip with a clear
message.

The coordinator fixture serves from the test event loop, and Spark's planner and the
commit listener call it: Spark actions therefore run in a worker thread
(``asyncio.to_thread``) so the loop keeps serving while Spark waits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("pyspark", reason="Spark tests need the keyrange[spark] extra")

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition

from client.http import CoordinatorClient


def _java_missing() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None or not Path(java).exists():
        return "Spark tests need a Java 17+ runtime: no java on PATH and JAVA_HOME unset"
    probe = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"Spark tests need a working Java runtime: `{java} -version` failed"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    reason = _java_missing()
    if reason is not None:
        pytest.skip(reason)
    # Executors and the planner must run this interpreter, whose venv has the client.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from client.spark import register

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("keyrange-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.noDataProgressEventInterval", "100000")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
    # py4j says at INFO that it closes each connection when the interpreter collects it at
    # exit, after pytest closed the streams the log handlers of earlier tests write to.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture
def committer(spark: Any, coordinator_url: str) -> Iterator[Any]:
    """The explicit listener of ``enable_commits``, for this test only: the source reports
    by itself, and other tests count its reports alone."""
    from client.spark import enable_commits

    listener = enable_commits(spark, coordinator_url)
    yield listener
    spark.streams.removeListener(listener)


@pytest.fixture
def group() -> str:
    return f"spark-{uuid.uuid4().hex[:10]}"


Result = TypeVar("Result")


async def in_spark_thread(spark: Any, action: Callable[[], Result]) -> Result:
    """Run a blocking Spark action in a worker thread, with the session active there.

    Spark looks Python data sources up in the JVM thread's active session, and a py4j call
    from a new Python thread arrives on a JVM thread that has none.
    """

    def call() -> Result:
        session_class = spark._jvm.org.apache.spark.sql.SparkSession
        session_class.setActiveSession(spark._jsparkSession)
        return action()

    return await asyncio.to_thread(call)


def keyed_record(index: int) -> tuple[bytes | None, bytes]:
    """Keys repeat (so per-key order matters); every 10th record has no key."""
    key = None if index % 10 == 9 else f"user-{index % 37}".encode()
    return key, f"{index}".encode()


async def produce(
    bootstrap: str, topic: str, partitions: int, first: int, count: int
) -> list[tuple[int, int]]:
    """Produce records ``first .. first+count-1`` round robin; their (partition, offset)s."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        pending = []
        for index in range(first, first + count):
            key, value = keyed_record(index)
            pending.append(
                await producer.send(
                    topic,
                    key=key,
                    value=value,
                    partition=index % partitions,
                    headers=[("index", value)],
                )
            )
        return [((meta := await future).partition, meta.offset) for future in pending]
    finally:
        await producer.stop()


async def read_all(
    bootstrap: str, topic: str, partitions: int, expected: int, timeout_ms: int = 20_000
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` once ``expected`` have arrived (or the timeout passes)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        tps = [TopicPartition(topic, partition) for partition in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        waited = 0
        while len(records) < expected and waited < timeout_ms:
            fetched = await consumer.getmany(timeout_ms=500)
            waited += 500 if not fetched else 0
            for chunk in fetched.values():
                records.extend(chunk)
        # A short extra poll catches duplicates that would arrive after the expected count.
        for chunk in (await consumer.getmany(timeout_ms=500)).values():
            records.extend(chunk)
    finally:
        await consumer.stop()
    return records


async def stable_offsets(coordinator_url: str, group: str, topic: str) -> dict[int, int]:
    async with CoordinatorClient(coordinator_url) as api:
        committed = await api.fetch_offsets(group, topics=[topic])
    return {tp.partition: state.stable_offset for tp, state in committed.items()}


def log_ends(produced: Sequence[tuple[int, int]]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for partition, offset in produced:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends
