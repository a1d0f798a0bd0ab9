"""The runtime on its protocols alone (issue 28): driven over the in-memory record feed, a
producer that records what it is given and a restorer with nothing to restore, no broker.
Records go in, counts come out, and a commit marks the records whose outputs were flushed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiokafka.structs import RecordMetadata, TopicPartition

from client.protocol.keyspace import KeyRange, key_hash
from client.streams.restore import RestoreProgress
from client.streams.runtime import StreamsRuntime
from client.streams.state import StateManager
from client.streams.stores import BytesStore
from tests.client.in_memory_source import InMemorySource
from tests.streams.harness import count_topology, increments
from tests.streams.test_task import Rec
from tests.waiting import until

WORDS = TopicPartition("words", 0)


class Producer:
    """Acknowledges every record at once, at the next offset of its topic-partition."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self._offsets: dict[tuple[str, int], int] = {}

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        self.sent.append((topic, key, value))
        at = (topic, partition or 0)
        offset = self._offsets.get(at, 0)
        self._offsets[at] = offset + 1
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        delivery.set_result(
            RecordMetadata(
                topic=topic,
                partition=at[1],
                topic_partition=TopicPartition(*at),
                offset=offset,
                timestamp=-1,
                timestamp_type=-1,
                log_start_offset=0,
            )
        )
        return delivery

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


async def test_records_in_counts_out_and_a_commit_marks_them() -> None:
    topology = count_topology("words", "counts").build()
    source = InMemorySource()
    producer = Producer()
    commits: list[int] = []

    async def commit() -> None:
        commits.append(len(source.marked))

    runtime = StreamsRuntime(
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
        max_buffered=100,
        processing_threads=1,
        on_restore=lambda _: None,
    )
    source.grant(WORDS)
    runtime.assigned()
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

    await runtime.finish(5)
    await asyncio.wait_for(running, 5)
    assert source.given_back == []
