"""``run()``'s dispatcher alone, over an in-memory source of records: per-key order, and what a
lost membership does to queued and running records."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from client.dispatch import Dispatcher
from client.errors import ConsumerStopped
from client.protocol.keyspace import KeyRange
from tests.client.in_memory_source import InMemorySource
from tests.waiting import until

TP = TopicPartition("t", 0)


@dataclass(frozen=True)
class FakeRecord:
    offset: int
    key: int


class Source(InMemorySource):
    """Records put in by the test; the hand-out guard is a flag the test flips."""

    def __init__(self) -> None:
        super().__init__()
        self.allowed = True
        self.on_loss: list[Dispatcher] = []

    def put(self, offset: int, key: int) -> None:
        self.items.put_nowait((TP, FakeRecord(offset, key), key))

    def may_hand_out(self) -> bool:
        if not self.allowed:
            # Lost, as the consumer's loss ends the gate; the records put in later are
            # handed out after the member rejoined, under new leases.
            self.gate.end()
            self.gate.grant({TP: [KeyRange.full()]})
            for dispatcher in self.on_loss:
                dispatcher.lost({})
        return self.allowed


async def test_records_of_one_key_run_one_at_a_time_in_offset_order() -> None:
    source = Source()
    running: dict[int, int] = {}
    order: list[tuple[int, int]] = []

    async def handle(record: FakeRecord) -> None:
        assert running.get(record.key, 0) == 0, "two records of one key at once"
        running[record.key] = running.get(record.key, 0) + 1
        await asyncio.sleep(0.001)
        order.append((record.key, record.offset))
        running[record.key] -= 1

    dispatcher = Dispatcher(source, handle, 4, cancel_on_loss=True)
    for offset in range(40):
        source.put(offset, offset % 3)
    task = asyncio.create_task(dispatcher.run())
    await until(lambda: len(source.marked) == 40, 30, "every record marked")
    await dispatcher.stopping(5)
    await task
    for key in range(3):
        offsets = [offset for k, offset in order if k == key]
        assert offsets == sorted(offsets)


async def test_a_lost_membership_cancels_running_handlers_and_marks_nothing_of_theirs() -> None:
    source = Source()
    started = asyncio.Event()
    outcomes: list[str] = []

    async def handle(record: FakeRecord) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            outcomes.append(f"cancelled {record.offset}")
            raise

    dispatcher = Dispatcher(source, handle, 2, cancel_on_loss=True)
    source.on_loss.append(dispatcher)
    source.put(0, 1)
    task = asyncio.create_task(dispatcher.run())
    await asyncio.wait_for(started.wait(), 30)
    dispatcher.lost({})
    await until(lambda: outcomes == ["cancelled 0"], 30, "the running handler to be cancelled")
    assert source.marked == []
    # The worker lives on: the next record (after the member rejoined) is processed.
    started.clear()
    source.put(1, 2)
    await until(started.is_set, 30, "the next record to start")
    await dispatcher.stopping(0.1)
    await task


async def test_a_handler_that_notices_the_loss_itself_leaves_its_worker_alive() -> None:
    source = Source()
    noticed: list[int] = []

    async def handle(record: FakeRecord) -> None:
        await asyncio.sleep(0)
        if record.offset == 0:
            source.allowed = False
            if not source.may_hand_out():  # what still_owned() asks
                noticed.append(record.offset)
            source.allowed = True

    dispatcher = Dispatcher(source, handle, 1, cancel_on_loss=True)
    source.on_loss.append(dispatcher)
    source.put(0, 1)
    task = asyncio.create_task(dispatcher.run())
    await until(lambda: noticed == [0], 30, "the handler to notice the loss")
    source.put(1, 2)
    await until(lambda: source.marked == [1], 30, "the one worker to process the next record")
    source.stopped = True
    await dispatcher.stopping(5)
    await task
    assert not isinstance(task.exception(), ConsumerStopped)


async def test_a_handler_that_swallows_its_cancellation_at_shutdown_is_not_marked() -> None:
    """Cancelled because the drain timed out: whatever it did after swallowing the
    cancellation is not trusted, and the record goes to the next owner (issue 27 item 7)."""
    source = Source()
    started = asyncio.Event()

    async def handle(record: FakeRecord) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return

    dispatcher = Dispatcher(source, handle, 1, cancel_on_loss=True)
    source.put(0, 1)
    task = asyncio.create_task(dispatcher.run())
    await asyncio.wait_for(started.wait(), 30)
    source.stopped = True
    await dispatcher.stopping(0.1)
    await task
    assert source.marked == []
    assert source.given_back == [0]
