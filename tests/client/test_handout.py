"""The hand-out tracker alone: what user code holds, marking, draining before a revoke."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from client.fetcher import Run
from client.handout import HandedOut
from client.protocol.keyspace import KeyRange

TP = TopicPartition("t", 0)
LOWER, UPPER = KeyRange.full().split(2)


@dataclass(frozen=True)
class FakeRecord:
    topic: str
    partition: int
    offset: int


def record(offset: int) -> FakeRecord:
    return FakeRecord("t", 0, offset)


def test_a_record_handed_out_is_held_until_taken_once() -> None:
    handed = HandedOut()
    handed.hand_out(("t", 0), 5, LOWER.start)
    assert handed.holds(record(5))
    assert handed.take(record(5)) == LOWER.start
    assert not handed.holds(record(5))
    assert handed.take(record(5)) is None


def test_a_whole_batch_is_marked_in_one_step_only_when_it_is_the_oldest_one() -> None:
    handed = HandedOut()
    first = [record(1), record(2)]
    second = [record(3)]
    handed.hand_out_batch(Run(TP, list(first), [1, 2], [LOWER.start, LOWER.start]))
    handed.hand_out_batch(Run(TP, list(second), [3], [LOWER.start]))
    marked: list[list[int]] = []

    def mark(_: TopicPartition, offsets: list[int]) -> bool:
        marked.append(offsets)
        return True

    assert not handed.take_oldest_batch(second, mark)
    assert handed.take_oldest_batch(first, mark)
    assert marked == [[1, 2]]
    assert not handed.holds(record(1)) and handed.holds(record(3))


async def test_a_drain_ends_when_the_last_record_of_the_slices_is_marked() -> None:
    handed = HandedOut()
    handed.hand_out(("t", 0), 1, LOWER.start)
    handed.hand_out(("t", 0), 2, UPPER.start)
    revoked = {TP: [UPPER]}
    draining = asyncio.create_task(handed.drain(revoked, timeout_s=30))
    await asyncio.sleep(0)
    assert not draining.done()
    handed.take(record(1))  # a record of a slice that stays: the drain goes on
    await asyncio.sleep(0)
    assert not draining.done()
    handed.take(record(2))
    assert await asyncio.wait_for(draining, 30) is True


async def test_a_drain_gives_up_at_its_timeout_and_forget_drops_what_it_waited_for() -> None:
    handed = HandedOut()
    handed.hand_out(("t", 0), 2, UPPER.start)
    assert await handed.drain({TP: [UPPER]}, timeout_s=0.01) is False
    handed.forget({TP: [UPPER]})
    assert not handed.holds(record(2))
