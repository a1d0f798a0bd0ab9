"""Processing rounds: the active tasks' buffered records run for one time budget, round robin
on the event loop, or each task on a thread of the processing pool (``processing_threads``
above 1). Every round of a task is registered in the ownership gate while it runs (a
revocation of its keys waits for it, a pool thread included), and every record starts only
through the gate's check (``client.streams.gate``)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from client.runtime.gate import Running
from client.streams.gate import TaskGate
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
        self._pool = (
            None
            if processing_threads <= 1
            else ThreadPoolExecutor(processing_threads, thread_name_prefix="keyrange-streams")
        )

    def shutdown(self) -> None:
        """Wait for the pool's threads (a thread cannot be interrupted)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

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
        # Each task's round is in the gate while it runs: a revocation of its keys waits.
        entered: list[tuple[StreamTask, Running]] = []
        for task in self.startable(session_deadline):
            running = self._gate.enter(task, self._home(task))
            if running is not None:
                entered.append((task, running))
        try:
            active = [task for task, _ in entered]
            if self._pool is None:
                progressed = process_for(self._gate, active, now_ms, session_deadline)
            else:
                loop = asyncio.get_running_loop()
                busy = [task for task in active if task.inputs.buffered()]
                outcomes = await asyncio.gather(
                    *(
                        loop.run_in_executor(
                            self._pool, process_for, self._gate, [task], now_ms, session_deadline
                        )
                        for task in busy
                    )
                )
                progressed = any(outcomes)
        finally:
            for _, running in entered:
                self._gate.exit(running)
        if progressed and any(task.inputs.buffered() for task in self.startable(session_deadline)):
            self._work.set()

    def _home(self, task: StreamTask) -> str:
        return self._topology.subtopologies[task.id.subtopology].source_topics[0]


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
