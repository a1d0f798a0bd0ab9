"""The runtime kernel's pools (``client.runtime.pools``) on their own, without a consumer: the
gate asked right before a call starts, how a call ended (``NotStarted``, ``Stopped``, a
cancellation meant for the task), and a key range's run registered while it runs. The
worker's and streams' uses of them are tested with their runtimes (test_worker_deadline.py,
tests/streams)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange
from client.runtime.gate import OwnershipGate
from client.runtime.pools.loop import LoopPool
from client.runtime.pools.pool import NotStarted, RangeClaim, RecordClaim, Stopped
from client.runtime.pools.threads import ThreadPool
from tests.waiting import until

TP = TopicPartition("orders", 0)


class Slot:
    stop: Callable[[], None] | None = None


def granted() -> OwnershipGate:
    gate = OwnershipGate(lambda: time.monotonic() + 60)
    gate.grant({TP: [KeyRange.full()]})
    return gate


def claim(gate: OwnershipGate, hashed: int) -> RecordClaim:
    return RecordClaim(gate.lease(TP, hashed), TP, hashed, hashed)


async def test_the_loop_pool_asks_the_gate_and_registers_the_call_while_it_runs() -> None:
    gate = granted()
    pool = LoopPool(gate)
    seen: list[int] = []

    async def handler() -> str:
        seen.append(len(gate.running_in(None)))
        return "done"

    assert await pool.run(claim(gate, 7), Slot(), handler) == "done"
    assert seen == [1] and gate.running_in(None) == []
    old = claim(gate, 7)
    gate.revoke({TP: [KeyRange(0, 10)]})
    with pytest.raises(NotStarted):
        await pool.run(old, Slot(), handler)
    assert seen == [1]


async def test_a_loop_call_stopped_ends_as_stopped_and_a_cancel_for_the_task_stays() -> None:
    gate = granted()
    pool = LoopPool(gate)
    slot = Slot()
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    stopped = asyncio.ensure_future(pool.run(claim(gate, 1), slot, forever))
    await started.wait()
    assert slot.stop is not None
    slot.stop()
    slot.stop()
    with pytest.raises(Stopped):
        await stopped
    assert slot.stop is None and gate.running_in(None) == []
    assert stopped.cancelling() == 0

    started.clear()
    cancelled = asyncio.ensure_future(pool.run(claim(gate, 2), slot, forever))
    await started.wait()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert gate.running_in(None) == []


async def test_a_thread_call_stopped_before_a_thread_took_it_never_starts() -> None:
    gate = granted()
    pool = ThreadPool(1, gate, "test-pool")
    release = threading.Event()
    ran: list[int] = []

    def hold(offset: int) -> None:
        ran.append(offset)
        release.wait(30)

    slots = [Slot(), Slot()]
    try:
        holding = asyncio.ensure_future(pool.run(claim(gate, 0), slots[0], hold, 0))
        await until(lambda: ran == [0], 30, "the one thread taken")
        waiting = asyncio.ensure_future(pool.run(claim(gate, 1), slots[1], ran.append, 1))
        await until(lambda: slots[1].stop is not None, 30, "the second call queued")
        assert slots[1].stop is not None
        slots[1].stop()
        with pytest.raises(NotStarted):
            await waiting
        # A started thread call cannot be stopped: it runs out.
        assert slots[0].stop is not None
        slots[0].stop()
        release.set()
        await holding
    finally:
        release.set()
        pool.close(wait=True)
    assert ran == [0]


async def test_a_range_run_on_a_thread_holds_its_whole_range_in_the_gate() -> None:
    gate = granted()
    pool = ThreadPool(1, gate, "test-pool")
    inside = threading.Event()
    release = threading.Event()

    def round_of_records() -> bool:
        inside.set()
        release.wait(30)
        return True

    keys = KeyRange(100, 200)
    run = RangeClaim(gate.lease_covering(TP, keys), TP, keys, lambda: (150, 3))
    try:
        running = asyncio.ensure_future(pool.run(run, None, round_of_records))
        await until(inside.is_set, 30, "the round started")
        assert [call.keys for call in gate.running_in({TP: [KeyRange(199, 300)]})] == [keys]
        assert gate.running_in({TP: [KeyRange(201, 300)]}) == []
        assert gate.running_in(None)[0].record() == (150, 3)
        release.set()
        assert await running is True
    finally:
        release.set()
        pool.close(wait=True)
    assert gate.running_in(None) == []


def test_the_loop_pool_runs_claims_together_with_those_the_gate_lets_in() -> None:
    gate = granted()
    pool = LoopPool(gate)
    gone = claim(gate, 50)
    gate.revoke({TP: [KeyRange(40, 60)]})
    kept = claim(gate, 1)
    seen: list[tuple[list[RecordClaim], int]] = []

    def together(entered: list[RecordClaim], tag: str) -> str:
        seen.append((entered, len(gate.running_in(None))))
        return tag

    assert pool.run_together([kept, gone], together, "round") == "round"
    assert seen == [([kept], 1)]
    assert gate.running_in(None) == []
