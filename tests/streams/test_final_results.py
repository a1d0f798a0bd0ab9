"""A window's final result is never lost (issue 46, item 1): its final mark reaches the
changelog only after Kafka acknowledged the result, so an instance that dies, or whose sink
refuses the record, between the two leaves the window unmarked, and whoever restores the
changelog emits it. Offline: the runtime over the in-memory feed, a producer that
acknowledges changelog batches at once and leaves the sink's pending or fails them, and a
restorer that replays what the changelog acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import RecordMetadata, TopicPartition

from client.protocol.keyspace import KeyRange, key_hash
from client.streams import JSON, STRING
from client.streams.dsl import StreamsBuilder, session, tumbling
from client.streams.errors import SendFailed
from client.streams.internal import for_application
from client.streams.restore import RestoreProgress
from client.streams.runtime import StreamsRuntime
from client.streams.state import StateManager
from client.streams.stores import BytesStore
from client.streams.topology import BuiltTopology
from client.streams.window_store import FINAL, decode_change
from tests.client.in_memory_source import InMemorySource
from tests.streams.test_dsl import windowed_app
from tests.streams.test_runtime_offline import Batch
from tests.streams.test_task import Rec
from tests.waiting import until

VIEWS = TopicPartition("views", 0)
APP = "app"


def final_counts() -> BuiltTopology:
    builder = StreamsBuilder()
    counted = (
        builder.stream("views", key_serde=STRING, value_serde=JSON)
        .group_by_key()
        .windowed_by(tumbling(100))
        .count(name="per-user", persistent=False)
    )
    counted.final().to_stream().map(
        lambda w, n: (w.key, [w.start, n]), key_serde=STRING, value_serde=JSON
    ).to("out")
    return for_application(builder.build().build(), APP)


class Producer:
    """Acknowledges changelog batches at once and keeps what they hold, per topic, as the
    changelog a restore reads; a sink batch is left pending, or failed with ``sink_error``."""

    def __init__(self, sink_error: BaseException | None = None) -> None:
        self.changelogs: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
        self.sinks: list[tuple[bytes | None, bytes | None]] = []
        self.sink_batches = 0
        self._sink_error = sink_error
        self._sink_pending = sink_error is None

    def acknowledge_sinks(self) -> None:
        self._sink_pending = False

    def create_batch(self) -> Batch:
        return Batch(100)

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        records = [(key, value) for key, value, _ in batch.records]
        if not topic.endswith("-changelog"):
            self.sink_batches += 1
        if topic.endswith("-changelog"):
            log = self.changelogs.setdefault(topic, [])
            offset = len(log)
            log.extend(records)
        elif self._sink_error is not None:
            delivery.set_exception(self._sink_error)
            return delivery
        elif self._sink_pending:
            return delivery
        else:
            offset = len(self.sinks)
            self.sinks.extend(records)
        delivery.set_result(
            RecordMetadata(topic, partition, TopicPartition(topic, partition), offset, -1, 0, 0)
        )
        return delivery

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def flush(self) -> None:
        return None


class ChangelogRestorer:
    """Restores what an earlier instance's changelog writes were acknowledged."""

    def __init__(self, changelogs: dict[str, list[tuple[bytes | None, bytes | None]]]) -> None:
        self._changelogs = changelogs

    async def restore(
        self,
        topic: str,
        progress: RestoreProgress,
        backend: BytesStore,
        on_progress: Callable[[RestoreProgress], None] = lambda _: None,
    ) -> RestoreProgress:
        log = self._changelogs.get(topic, [])
        backend.apply([(key, value) for key, value in log if key is not None])
        progress.position = progress.end_offset = len(log)
        progress.done = True
        return progress


def runtime(
    source: InMemorySource, producer: Producer, restorer: ChangelogRestorer
) -> StreamsRuntime:
    topology = final_counts()

    async def commit() -> None:
        return None

    return StreamsRuntime(
        source,
        topology=topology,
        application_id=APP,
        producer=producer,
        restorer=restorer,
        state=StateManager(topology, None),
        owned=lambda: [(VIEWS, KeyRange.full(), 0)],
        commit=commit,
        commit_interval_s=3600,
        max_idle_ms=0,
        max_buffered_bytes=1 << 20,
        processing_threads=1,
        on_restore=lambda _: None,
    )


def feed(source: InMemorySource, views: list[tuple[str, int]]) -> None:
    for offset, (user, timestamp) in enumerate(views):
        key = user.encode()
        record = Rec("views", offset, key, b"{}", timestamp)
        source.items.put_nowait((VIEWS, record, key_hash(key, offset)))


def results(sinks: list[tuple[bytes | None, bytes | None]]) -> list[tuple[str, int, int]]:
    return [(key.decode(), *json.loads(value)) for key, value in sinks if key and value is not None]


def marks(changelogs: dict[str, list[tuple[bytes | None, bytes | None]]]) -> list[int]:
    return [
        decode_change(value)[0]
        for log in changelogs.values()
        for _, value in log
        if value is not None and decode_change(value)[2] & FINAL
    ]


# u's views in the window [0, 100), then v's at 250, which closes it.
VIEWS_THEN_CLOSE = [("u", 10), ("u", 20), ("v", 250)]


@pytest.mark.parametrize("sink", ["pending", "refused", "session lost"])
async def test_a_window_whose_result_was_not_acknowledged_is_emitted_by_the_next_owner(
    sink: str,
) -> None:
    """The first instance emits u's window and dies (its sink batch still pending), stops on
    the sink's refusal, or loses its session and then commits what it still may; its
    changelog writes were all acknowledged. A
    fresh instance restores that changelog, is given the same views plus a later one, and
    emits u's window: before, the mark had reached the changelog with the result still on
    its way, the restore found the window final, and nobody ever emitted it."""
    refused = RuntimeError("the sink topic refused the record")
    first_producer = Producer(sink_error=refused if sink == "refused" else None)
    source = InMemorySource()
    first = runtime(source, first_producer, ChangelogRestorer({}))
    source.grant(VIEWS)
    first.assigned({VIEWS: [KeyRange.full()]})
    running = asyncio.create_task(first.run())
    feed(source, VIEWS_THEN_CLOSE)
    if sink == "refused":
        with pytest.raises(SendFailed):
            await asyncio.wait_for(running, 10)
    else:
        await until(
            lambda: (
                first_producer.sink_batches == 1
                and any(key == b"v" for log in first_producer.changelogs.values() for key, _ in log)
            ),
            10,
            "the result and the round's changelog writes handed over",
        )
        if sink == "session lost":
            first.lost({VIEWS: [KeyRange.full()]})
            await first.commit()
            await first.dropped({VIEWS: [KeyRange.full()]})
        # Killed: nothing after this point runs, no commit, no flush.
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    assert source.marked == []
    assert first_producer.sinks == []
    assert marks(first_producer.changelogs) == [], "a mark went out ahead of its result"

    second_producer = Producer()
    second_producer.acknowledge_sinks()
    again = InMemorySource()
    second = runtime(again, second_producer, ChangelogRestorer(first_producer.changelogs))
    again.grant(VIEWS)
    second.assigned({VIEWS: [KeyRange.full()]})
    running = asyncio.create_task(second.run())
    feed(again, [*VIEWS_THEN_CLOSE, ("v", 400)])
    await until(
        lambda: any(user == "u" for user, _, _ in results(second_producer.sinks)),
        10,
        "u's window [0, 100) emitted by the next owner",
    )
    ((start, views),) = [(s, n) for user, s, n in results(second_producer.sinks) if user == "u"]
    # The restored count (2) plus the replayed views: at least once, never below.
    assert start == 0 and views >= 2
    await second.stopping(5)
    await asyncio.wait_for(running, 5)


async def test_a_mark_is_written_at_the_commit_after_its_result_is_acknowledged() -> None:
    """The mark still goes out, once: at the commit that follows the result's
    acknowledgement, before the inputs are marked; so a graceful hand-off carries it."""
    producer = Producer()
    producer.acknowledge_sinks()
    source = InMemorySource()
    run = runtime(source, producer, ChangelogRestorer({}))
    source.grant(VIEWS)
    run.assigned({VIEWS: [KeyRange.full()]})
    running = asyncio.create_task(run.run())
    feed(source, VIEWS_THEN_CLOSE)
    await until(lambda: results(producer.sinks) == [("u", 0, 2)], 10, "u's window emitted")
    assert marks(producer.changelogs) == []

    await run.commit()
    assert marks(producer.changelogs) == [0]
    assert source.marked == [0, 1, 2]
    await run.stopping(5)
    await asyncio.wait_for(running, 5)
    assert marks(producer.changelogs) == [0]


def test_a_record_reaching_a_session_emitted_but_not_yet_marked_is_late(tmp_path: Path) -> None:
    """Between a session's emission and its mark (the next commit), the task holds it final
    all the same: a record that would merge it with a session still open is dropped as late,
    as when the mark was written at once. The offline task below never commits, so no mark
    is ever written. With gap 10 and grace 10: k's [0, 9] is emitted once stream time is 38,
    and k@19 falls within the gap of both [0, 9] and the open [29, 38]; merged, they would
    end at 38, which Kafka Streams' rule (by the merged session's end) does not call late."""
    run = windowed_app(session(10, grace_ms=10), final=True, tmp_path=tmp_path)
    for key, stamp in [("k", 0), ("k", 9), ("k", 29), ("k", 38), ("k", 19), ("z", 200)]:
        run.send("views", key.encode(), b"{}", stamp)
    emitted = [(k.decode(), *json.loads(v or b"")) for k, v in run.out["out"]]
    assert [row for row in emitted if row[0] == "k"] == [("k", 0, 9, 2), ("k", 29, 38, 2)]
