"""The kernel's intake alone, over the in-memory record source: records go to the runtime in
the order taken and are charged to its budget first; the intake ends quietly when its runtime
stops or the consumer was stopped, raises any other end of the fetch, and takes nothing more
while the runtime's bounded queue is full."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

import pytest
from aiokafka.structs import TopicPartition

from client.errors import ConsumerStopped
from client.fetcher import Item
from client.runtime.budget import RECORD_OVERHEAD_BYTES, ByteBudget
from client.runtime.intake import Intake
from tests.client.in_memory_source import InMemorySource
from tests.waiting import until

TP = TopicPartition("t", 0)


@dataclass(frozen=True)
class Rec:
    offset: int
    serialized_key_size: int = 1
    serialized_value_size: int = 99


class Source(InMemorySource):
    """Ends its fetch with ``ConsumerStopped`` once told to, stopped or not."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = asyncio.Event()

    def put(self, offset: int) -> None:
        self.items.put_nowait((TP, Rec(offset), offset))

    async def next_item(self, interrupt: asyncio.Future[None]) -> Item:
        if self.ended.is_set():
            raise ConsumerStopped("the consumer is not running")
        return await super().next_item(interrupt)


async def test_records_go_to_the_runtime_in_order_each_charged_before() -> None:
    source = Source()
    budget = ByteBudget(10**9, 0.5, source.pause, source.resume)
    taken: list[tuple[int, int]] = []
    intake = Intake(source, lambda item: taken.append((item[1].offset, budget.total)), budget)
    until_done = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(intake.run(until_done))
    for offset in range(5):
        source.put(offset)
    await until(lambda: len(taken) == 5, 10, "every record taken")
    per_record = 100 + RECORD_OVERHEAD_BYTES
    assert taken == [(offset, (offset + 1) * per_record) for offset in range(5)]
    until_done.set_result(None)
    await asyncio.wait_for(running, 10)


async def test_a_partition_over_its_share_is_paused_at_the_source() -> None:
    source = Source()
    budget = ByteBudget(3 * (100 + RECORD_OVERHEAD_BYTES), 0.5, source.pause, source.resume)
    intake = Intake(source, lambda _: None, budget)
    until_done = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(intake.run(until_done))
    for offset in range(3):
        source.put(offset)
    await until(lambda: budget.total == 3 * 500, 10, "three records charged")
    assert source.paused == set()
    source.put(3)
    await until(lambda: source.paused == {TP}, 10, "the partition paused")
    budget.refund(TP, 3 * 500, records=3)
    assert source.paused == set()
    until_done.set_result(None)
    await asyncio.wait_for(running, 10)


async def test_the_runtime_stopping_ends_it_quietly() -> None:
    source = Source()
    intake = Intake(source, lambda _: None)
    until_done = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(intake.run(until_done))
    await asyncio.sleep(0)
    until_done.set_result(None)
    await asyncio.wait_for(running, 10)
    assert running.result() is None


async def test_a_stopped_consumer_ends_it_quietly() -> None:
    source = Source()
    source.stopped = True
    source.ended.set()
    intake = Intake(source, lambda _: None)
    await asyncio.wait_for(intake.run(asyncio.get_running_loop().create_future()), 10)


async def test_consumer_stopped_of_a_consumer_still_running_is_raised() -> None:
    source = Source()
    source.ended.set()
    intake = Intake(source, lambda _: None)
    with pytest.raises(ConsumerStopped):
        await asyncio.wait_for(intake.run(asyncio.get_running_loop().create_future()), 10)


async def test_nothing_more_is_taken_while_the_runtime_says_to_wait() -> None:
    source = Source()
    room = asyncio.Event()
    taken: list[int] = []

    async def wait_for_room() -> None:
        await room.wait()

    def take(item: Item) -> Awaitable[None] | None:
        taken.append(item[1].offset)
        return wait_for_room() if len(taken) == 2 else None

    intake = Intake(source, take)
    until_done = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(intake.run(until_done))
    for offset in range(4):
        source.put(offset)
    await until(lambda: taken == [0, 1], 10, "two records taken")
    # The queue is full: the next two records stay with the source until there is room.
    await until(lambda: source.items.qsize() == 2, 10, "the rest left at the source")
    for _ in range(20):
        await asyncio.sleep(0)  # turns of the loop the intake would take them in
    assert taken == [0, 1] and source.items.qsize() == 2
    room.set()
    await until(lambda: taken == [0, 1, 2, 3], 10, "the rest taken once there was room")
    until_done.set_result(None)
    await asyncio.wait_for(running, 10)
