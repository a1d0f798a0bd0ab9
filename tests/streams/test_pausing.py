"""KIP-28's synchronization end to end, on the real broker and coordinator: a task whose
input runs ahead pauses that input's fetching once its partition holds its share of the byte
budget while it waits for its empty input, so a join never holds a whole topic in memory, and
once both inputs have records it processes them in timestamp order across the two."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from client.runtime.budget import RECORD_OVERHEAD_BYTES
from client.streams import (
    WALL_CLOCK,
    Processor,
    ProcessorContext,
    StoreSpec,
    StreamsApp,
    StreamsConfig,
    Topology,
)
from tests.fixtures.services import MakeTopic
from tests.streams.harness import accept_range_fetch, running
from tests.waiting import until

RECORDS = 100
# Left records whose weight is the left partition's share of the byte budget: the two inputs'
# partitions share ``max_buffered_bytes``, so the left one pauses past this many records.
MAX_BUFFERED = 10


class Recorder(Processor):
    """Notes (topic, timestamp) of every record it sees, in the order it sees them. Its
    wall-clock punctuation does nothing: the task's count of them shows processing rounds
    going by."""

    def __init__(self, seen: list[tuple[str, int]]) -> None:
        self._seen = seen

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        context.schedule(10, WALL_CLOCK, lambda _: None)

    def process(self, key: Any, value: Any) -> None:
        self.context.state_store("last").put(key, value)
        self._seen.append((str(self.context.topic), self.context.timestamp))


def two_input_topology(left: str, right: str, seen: list[tuple[str, int]]) -> Topology:
    """Two sources whose processors share a store: one sub-topology, so one task reads both."""
    return (
        Topology()
        .add_source("left", left)
        .add_source("right", right)
        .add_processor("record-left", lambda: Recorder(seen), "left")
        .add_processor("record-right", lambda: Recorder(seen), "right")
        .add_state_store(StoreSpec("last"), "record-left", "record-right")
    )


async def produce_one_batch_each(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes, int]]
) -> None:
    """Each record in a record batch of its own, so a fetch of one batch brings one record."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value, timestamp in records:
            await producer.send_and_wait(
                topic, value=value, key=key, partition=0, timestamp_ms=timestamp
            )
    finally:
        await producer.stop()


class Observed:
    """The application's one task, as its metrics show it, and its real Kafka consumer,
    whose paused partitions and positions are what the broker is (or is not) asked for: no
    public surface of the application shows those."""

    def __init__(self, app: StreamsApp) -> None:
        self._app = app

    def task(self, name: str) -> Any:
        tasks = list(self._app.metrics().values())
        assert len(tasks) <= 1, tasks
        return tasks[0][name] if tasks else None

    def kafka(self) -> AIOKafkaConsumer:
        consumer: AIOKafkaConsumer = self._app._consumer._fetcher.kafka()
        return consumer

    def paused(self) -> set[TopicPartition]:
        return set(self.kafka().paused()) if self._app.runtime is not None else set()


async def test_an_input_that_runs_ahead_is_paused_until_the_other_catches_up(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    left, right = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, left, right)
    base = int(time.time() * 1000) - 60_000
    # Interleaved timestamps: the left input has the even ones, the right one the odd ones.
    left_records = [(b"l%d" % i, b"%d" % i, base + 2 * i) for i in range(RECORDS)]
    right_records = [(b"r%d" % i, b"%d" % i, base + 2 * i + 1) for i in range(RECORDS)]
    weights = [len(key) + len(value) + RECORD_OVERHEAD_BYTES for key, value, _ in left_records]
    share = sum(weights[:MAX_BUFFERED])
    await produce_one_batch_each(kafka_bootstrap, left, left_records)
    seen: list[tuple[str, int]] = []
    app = StreamsApp(
        two_input_topology(left, right, seen),
        StreamsConfig(
            application_id=f"pause-{left}",
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=coordinator_url,
            state_dir=tmp_path,
            commit_interval_ms=200,
            session_timeout_ms=3_000,
            show_progress=False,
            # Far longer than the test: only a record on the empty input ends the wait.
            max_task_idle_ms=600_000,
            max_buffered_bytes=2 * share,
            # One record batch a fetch (the embedded broker caps a fetch by its total size
            # only), so what is fetched before the pause is a record or so past the limit.
            consumer_options={"fetch_max_bytes": 1, "max_partition_fetch_bytes": 1},
        ),
    )
    left_tp = TopicPartition(left, 0)
    observed = Observed(app)
    async with running(app):
        await until(lambda: left_tp in observed.paused(), 60, "the left input paused")
        fetched = await observed.kafka().position(left_tp)
        await until(
            lambda: (
                observed.task("ready")
                and (observed.task("buffered") == fetched or observed.task("records") > 0)
            ),
            30,
            "the task restored, holding every record fetched",
        )
        # Wall-clock punctuations fire after a processing round: one more means a round ran
        # with those records buffered, and it chose to wait for the right input.
        ticks = observed.task("punctuations")
        await until(lambda: observed.task("punctuations") > ticks, 30, "a processing round")
        assert seen == [] and observed.task("records") == 0
        # Paused: the consumer fetched nothing more of it, so the task holds what it held.
        assert left_tp in observed.paused()
        assert await observed.kafka().position(left_tp) == fetched
        assert observed.task("buffered") == fetched
        assert share < sum(weights[:fetched]) < 2 * share

        # The right input, then one left record later than all: it lets the right input's
        # last record go, and is itself held, waiting for the right input.
        await produce_one_batch_each(kafka_bootstrap, right, right_records)
        await produce_one_batch_each(kafka_bootstrap, left, [(b"late", b"", base + 10 * RECORDS)])
        expected = sorted(
            [(left, stamp) for _, _, stamp in left_records]
            + [(right, stamp) for _, _, stamp in right_records],
            key=lambda entry: entry[1],
        )
        await until(
            lambda: len(seen) >= len(expected) or seen != expected[: len(seen)],
            60,
            "both inputs processed",
        )
        assert seen == expected
        await until(lambda: not observed.paused(), 30, "both inputs fetching again")
        assert observed.task("buffered") == 1
