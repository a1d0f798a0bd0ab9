"""The runtime on its protocols alone (issue 28): driven over the in-memory record feed, a
producer that records what it is given and a restorer with nothing to restore, no broker.
Records go in, counts come out, and a commit marks the records whose outputs were flushed;
records buffered over the byte budget pause their partition until processed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.structs import RecordMetadata, TopicPartition

from client.protocol.keyspace import KeyRange, key_hash
from client.runtime.budget import weight
from client.streams.restore import RestoreProgress
from client.streams.runtime import StreamsRuntime
from client.streams.state import StateManager
from client.streams.stores import BytesStore
from client.tracing import RecordTracer
from tests.client.in_memory_source import InMemorySource
from tests.streams.harness import count_topology, increments
from tests.streams.test_task import Rec
from tests.waiting import until

WORDS = TopicPartition("words", 0)


class Batch:
    """A batch of at most ``limit`` records (the real one's limit is in bytes), so a round's
    outputs for a partition take several."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
        self.closed = False

    def append(
        self,
        *,
        timestamp: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
    ) -> object | None:
        if self.closed or len(self.records) >= self.limit:
            return None
        self.records.append((key, value, list(headers)))
        return len(self.records) - 1

    def record_count(self) -> int:
        return len(self.records)

    def size(self) -> int:
        return sum(len(key or b"") + len(value or b"") for key, value, _ in self.records)

    def close(self) -> None:
        self.closed = True


class Producer:
    """Acknowledges every batch at once, at the next offsets of its topic-partition."""

    def __init__(self, batch_records: int = 3) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.batches: list[tuple[str, int, int]] = []
        self._batch_records = batch_records
        self._offsets: dict[tuple[str, int], int] = {}

    def create_batch(self) -> Batch:
        return Batch(self._batch_records)

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        assert batch.records, "an empty batch was sent"
        self.sent.extend((topic, key, value) for key, value, _ in batch.records)
        self.batches.append((topic, partition, batch.record_count()))
        at = (topic, partition)
        offset = self._offsets.get(at, 0)
        self._offsets[at] = offset + batch.record_count()
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        delivery.set_result(
            RecordMetadata(
                topic=topic,
                partition=partition,
                topic_partition=TopicPartition(*at),
                offset=offset,
                timestamp=-1,
                timestamp_type=-1,
                log_start_offset=0,
            )
        )
        return delivery

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def flush(self) -> None:
        return None


class Restorer:
    """A changelog with nothing in it."""

    async def restore(
        self,
        topic: str,
        progress: RestoreProgress,
        runtime: BytesStore,
        on_progress: Callable[[RestoreProgress], None] = lambda _: None,
    ) -> RestoreProgress:
        progress.done = True
        return progress


class HeldRestorer(Restorer):
    """Restores nothing until ``done`` is set: the task buffers its records meanwhile."""

    def __init__(self) -> None:
        self.done = asyncio.Event()

    async def restore(
        self,
        topic: str,
        progress: RestoreProgress,
        runtime: BytesStore,
        on_progress: Callable[[RestoreProgress], None] = lambda _: None,
    ) -> RestoreProgress:
        await self.done.wait()
        return await super().restore(topic, progress, runtime, on_progress)


def word_count_runtime(
    source: InMemorySource,
    producer: Producer,
    commit: Callable[[], Any],
    tracer: RecordTracer | None = None,
) -> StreamsRuntime:
    """The word count's runtime over ``source`` owning all of WORDS, no broker anywhere."""
    topology = count_topology("words", "counts").build()
    return StreamsRuntime(
        source,
        topology=topology,
        application_id="app",
        producer=producer,
        restorer=Restorer(),
        state=StateManager(topology, None),
        owned=lambda: [(WORDS, KeyRange.full(), 0)],
        commit=commit,
        commit_interval_s=60,
        max_idle_ms=0,
        max_buffered_bytes=1 << 20,
        processing_threads=1,
        on_restore=lambda _: None,
        tracer=tracer,
    )


async def test_records_in_counts_out_and_a_commit_marks_them() -> None:
    source = InMemorySource()
    producer = Producer()
    commits: list[int] = []

    async def commit() -> None:
        commits.append(len(source.marked))

    runtime = word_count_runtime(source, producer, commit)
    source.grant(WORDS)
    runtime.assigned({WORDS: [KeyRange.full()]})
    running = asyncio.create_task(runtime.run())
    words = ["a", "b", "a", "c", "a", "b"]
    for offset, (key, value, _) in enumerate(increments(words)):
        record = Rec("words", offset, key, value, 1_000 + offset)
        source.items.put_nowait((WORDS, record, key_hash(key, offset)))

    sinks = lambda: [(key, value) for topic, key, value in producer.sent if topic == "counts"]  # noqa: E731
    await until(lambda: len(sinks()) == len(words), 10, "a count per word")
    counts = [(key, int.from_bytes(value or b"", "big", signed=True)) for key, value in sinks()]
    assert counts == [(b"a", 1), (b"b", 1), (b"a", 2), (b"c", 1), (b"a", 3), (b"b", 2)]
    changelog = [topic for topic, _, _ in producer.sent if topic != "counts"]
    assert changelog == ["app-counts-changelog"] * len(words)
    assert source.marked == []

    await runtime.commit()
    assert source.marked == list(range(len(words)))
    assert commits == [len(words)]

    await runtime.stopping(5)
    await asyncio.wait_for(running, 5)
    assert source.given_back == []


@pytest.mark.parametrize("by_records", [False, True])
async def test_a_partition_over_its_byte_budget_pauses_until_its_task_processed_records(
    by_records: bool,
) -> None:
    """The streams runtime's backpressure is the kernel's byte budget: records its intake
    took in and no task processed yet (here: the task is restoring) are charged to their
    partition, which pauses over the bound and fetches again once the task processed them.
    The deprecated ``max_buffered_records`` pauses the same way at its count of records."""
    topology = count_topology("words", "counts").build()
    source = InMemorySource()
    restorer = HeldRestorer()
    records = [
        Rec("words", offset, key, value, 1_000 + offset)
        for offset, (key, value, _) in enumerate(increments(["a", "b", "c", "d"]))
    ]

    async def commit() -> None:
        return None

    runtime = StreamsRuntime(
        source,
        topology=topology,
        application_id="app",
        producer=Producer(),
        restorer=restorer,
        state=StateManager(topology, None),
        owned=lambda: [(WORDS, KeyRange.full(), 0)],
        commit=commit,
        commit_interval_s=60,
        max_idle_ms=0,
        # Three records fit; the fourth crosses the bound, or reaches the record cap.
        max_buffered_bytes=1 << 30 if by_records else sum(weight(r) for r in records[:3]),
        max_buffered_records=4 if by_records else None,
        processing_threads=1,
        on_restore=lambda _: None,
    )
    source.grant(WORDS)
    runtime.assigned({WORDS: [KeyRange.full()]})
    running = asyncio.create_task(runtime.run())
    for record in records[:3]:
        source.items.put_nowait((WORDS, record, key_hash(record.key, record.offset)))
    await until(lambda: source.items.empty(), 10, "three records taken in")
    assert source.paused == set()
    last = records[3]
    source.items.put_nowait((WORDS, last, key_hash(last.key, last.offset)))
    await until(lambda: source.paused == {WORDS}, 10, "the partition paused")

    restorer.done.set()
    task = next(iter(runtime.tasks))
    await until(lambda: task.metrics.records == 4, 10, "the restored task processed them")
    await until(lambda: source.paused == set(), 10, "the partition fetching again")

    await runtime.stopping(5)
    await asyncio.wait_for(running, 10)


class GatedProducer(Producer):
    """Holds the send of the record keyed ``held`` until ``release`` is set: the round that
    sends it keeps the runtime's round lock meanwhile, as a slow round does on a busy
    machine."""

    def __init__(self, held: bytes) -> None:
        super().__init__()
        self.held = held
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        if any(key == self.held for key, _, _ in batch.records):
            self.holding.set()
            await self.release.wait()
        return await super().send_batch(batch, topic, partition=partition)


async def test_records_a_partial_revocation_keeps_reach_the_heir_in_offset_order() -> None:
    """Found by the chaos suite's windowed page views: records of kept keys that arrived
    while the revoked task waited for a round to end were held back before the older
    records it still buffered, so the heir processed a later offset first. Its stream time
    then passed windows the older records belonged to, and they were dropped as late."""
    first, second = TopicPartition("words", 0), TopicPartition("words", 1)
    half = KeyRange.full().end // 2
    kept, revoked = KeyRange(0, half), KeyRange(half + 1, KeyRange.full().end)
    words = [
        word for word in (f"w{n}" for n in range(100)) if kept.contains(key_hash(word.encode(), 0))
    ][:4]
    topology = count_topology("words", "counts").build()
    source = InMemorySource()
    producer = GatedProducer(held=b"slow")
    owned = [(first, KeyRange.full(), 0), (second, KeyRange.full(), 0)]

    async def commit() -> None:
        return None

    runtime = StreamsRuntime(
        source,
        topology=topology,
        application_id="app",
        producer=producer,
        restorer=Restorer(),
        state=StateManager(topology, None),
        owned=lambda: owned,
        commit=commit,
        commit_interval_s=60,
        max_idle_ms=0,
        max_buffered_bytes=1 << 20,
        processing_threads=1,
        on_restore=lambda _: None,
    )
    source.grant(first)
    source.grant(second)
    runtime.assigned({first: [KeyRange.full()], second: [KeyRange.full()]})
    running = asyncio.create_task(runtime.run())

    def put(tp: TopicPartition, offset: int, word: str) -> None:
        record = Rec("words", offset, word.encode(), (1).to_bytes(8, "big"), 1_000 + offset)
        record.partition = tp.partition
        source.items.put_nowait((tp, record, key_hash(record.key, offset)))

    # A round is under way, its send held: what comes in now waits in the tasks.
    put(second, 0, "slow")
    await until(producer.holding.is_set, 10, "the round holding its send")
    put(first, 0, words[0])
    put(first, 1, words[1])
    await until(source.items.empty, 10, "the first records buffered")
    slices = {first: [revoked]}
    source.revoke(slices)
    runtime.revoking(slices)
    owned = [(first, kept, 0), (second, KeyRange.full(), 0)]
    # Newer records of kept keys come in while the revoked task waits for the round.
    put(first, 2, words[2])
    put(first, 3, words[3])
    await until(source.items.empty, 10, "the newer records taken in")
    producer.release.set()
    await runtime.revoked(slices)

    def counted() -> list[bytes | None]:
        return [key for topic, key, _ in producer.sent if topic == "counts" and key != b"slow"]

    await until(lambda: len(counted()) == 4, 10, "every kept record counted by the heir")
    assert counted() == [word.encode() for word in words]
    await runtime.stopping(5)
    await asyncio.wait_for(running, 10)
