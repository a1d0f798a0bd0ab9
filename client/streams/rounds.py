"""Processing rounds: the active tasks' buffered records run for one time budget, round robin
on the event loop (the kernel's loop pool), or each task on a thread of the kernel's thread
pool (``processing_threads`` above 1). Every round of a task is registered in the ownership
gate while it runs, entered right before it starts (a revocation of its keys waits for it, a
pool thread included), and every record starts only through the gate's check
(``client.streams.gate``)."""

from __future__ import annotations

import asyncio
import time

from client.runtime.pools.loop import LoopPool
from client.runtime.pools.pool import NotStarted
from client.runtime.pools.threads import ThreadPool
from client.streams.gate import TaskClaim, TaskGate
from client.streams.task import StreamTask
from client.streams.tasks import Tasks
from client.streams.topology import BuiltTopology

# One processing round's time budget: short enough that heartbeats, the intake and the
# commit timer get the loop often, long enough that the round's bookkeeping is amortized.
_ROUND_BUDGET_S = 0.02


class Rounds:
    def __init__(
        self,
        tasks: Tasks,
        topology: BuiltTopology,
        gate: TaskGate,
        processing_threads: int,
        work: asyncio.Event,
    ) -> None:
        self._tasks = tasks
        self._topology = topology
        self._gate = gate
        self._work = work
        self._loop = LoopPool(gate.ownership)
        self._threads = (
            None
            if processing_threads <= 1
            else ThreadPool(processing_threads, gate.ownership, "keyrange-streams")
        )

    def shutdown(self) -> None:
        """Wait for the pool's threads (a thread cannot be interrupted)."""
        if self._threads is not None:
            self._threads.close(wait=True)

    def startable(self, deadline: float) -> list[StreamTask]:
        """The tasks whose records may start before ``deadline`` (the gate's rule)."""
        return [task for task in self._tasks if self._gate.may_start(task, deadline)]

    async def run(self) -> None:
        """One round for up to one budget. Work is left flagged only when records remain
        after progress: a task waiting out an idle input is looked at again on the next
        tick, not in a loop that never yields."""
        session_deadline = self._gate.round_deadline()
        if session_deadline is None:
            # The session deadline passed (a frozen process, a blocked loop): asking has just
            # halted every task, and the keys may be another member's already.
            return
        now_ms = int(time.time() * 1000)
        claims = [
            self._gate.claim(task, self._home(task)) for task in self.startable(session_deadline)
        ]
        if self._threads is None:
            progressed = self._loop.run_together(
                claims, _process_claimed, self._gate, now_ms, session_deadline
            )
        else:
            busy = [claim for claim in claims if claim.task.inputs.buffered()]
            outcomes = await asyncio.gather(
                *(self._on_thread(claim, now_ms, session_deadline) for claim in busy)
            )
            progressed = any(outcomes)
        if progressed and any(task.inputs.buffered() for task in self.startable(session_deadline)):
            self._work.set()

    async def _on_thread(self, claim: TaskClaim, now_ms: int, session_deadline: float) -> bool:
        """One task's round on a pool thread; the gate is asked there, as it starts."""
        assert self._threads is not None
        try:
            return await self._threads.run(
                claim, None, process_for, self._gate, [claim.task], now_ms, session_deadline
            )
        except NotStarted:
            return False

    def _home(self, task: StreamTask) -> str:
        return self._topology.subtopologies[task.id.subtopology].source_topics[0]


def _process_claimed(
    claims: list[TaskClaim], gate: TaskGate, now_ms: int, session_deadline: float
) -> bool:
    return process_for(gate, [claim.task for claim in claims], now_ms, session_deadline)


def process_for(
    gate: TaskGate, tasks: list[StreamTask], now_ms: int, session_deadline: float
) -> bool:
    """Round robin over ``tasks`` for one budget, and not one record past the session
    deadline (docs/design.md §5, the client half: the coordinator may give the keys away then, and
    a record processed after it would write the new owner's state); True when a record was
    processed."""
    budget_end = time.monotonic() + _ROUND_BUDGET_S
    progressed_any = False
    progressed = True
    while progressed and time.monotonic() < budget_end:
        progressed = False
        for task in tasks:
            if gate.may_start(task, session_deadline) and task.process_next(now_ms) is True:
                progressed = progressed_any = True
    return progressed_any
