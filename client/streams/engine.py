"""The streams engine: what ``KeyrangeConsumer.drive`` runs for a ``StreamsApp``.

Two long-lived routines, one per concern, as in the Streams threading design: the intake
takes records from the consumer and buffers each in its task (tasks are created, and their
restoration started, when their slices are assigned), and the processing loop
runs the ready tasks round robin (on the loop, or each on a thread of the processing pool),
sends what they produced, fires wall-clock punctuations and commits (the protocol's steps:
``client.streams.commits``); one lock keeps a round, a commit and a task's closing apart.
Restorations run as their own tasks on a restore consumer of their own: only the restoring
task waits, the others go on.

Records start in user code, and outputs go to the producer, only through the ownership gate
(``client.streams.gate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiokafka.structs import TopicPartition

from client.errors import ConsumerStopped
from client.fetcher import FetchInterrupted
from client.http import Slices
from client.protocol.keyspace import KeyRange, key_hash, subtract
from client.runtime.gate import Running
from client.streams.commits import Commits
from client.streams.errors import SendFailed
from client.streams.gate import TaskGate
from client.streams.outputs import Outputs
from client.streams.ports import Producer, StoreRestorer, StreamSource
from client.streams.processor import WALL_CLOCK
from client.streams.restore import RestoreProgress
from client.streams.state import StateManager
from client.streams.task import StreamTask, TaskId, TaskState
from client.streams.tasks import Tasks
from client.streams.topology import BuiltTopology

logger = logging.getLogger(__name__)

# One processing round's time budget: short enough that heartbeats, the intake and the
# commit timer get the loop often, long enough that the round's bookkeeping is amortized.
_ROUND_BUDGET_S = 0.02
# How often an idle processing loop wakes for wall-clock punctuations and the commit timer.
_TICK_S = 0.05


class StreamEngine:
    def __init__(
        self,
        source: StreamSource,
        *,
        topology: BuiltTopology,
        application_id: str,
        producer: Producer,
        restorer: StoreRestorer,
        state: StateManager,
        owned: Callable[[], list[tuple[TopicPartition, KeyRange, int]]],
        commit: Callable[[], Any],
        commit_interval_s: float,
        max_idle_ms: int,
        max_buffered: int,
        processing_threads: int,
        on_restore: Callable[[RestoreProgress], None],
    ) -> None:
        self._source = source
        self._topology = topology
        self._application_id = application_id
        self._gate = TaskGate(source.gate, source.may_hand_out, source.session_deadline)
        self._restorer = restorer
        self._state = state
        self._owned = owned
        self._max_idle_ms = max_idle_ms
        self._max_buffered = max_buffered
        self._on_restore = on_restore
        self.tasks = Tasks(topology)
        self.restores: dict[TaskId, list[RestoreProgress]] = {}
        # The asyncio tasks restoring and closing stream tasks: handles to cancel and to
        # wait for; where a task is in its life is its ``state``.
        self._restorations: dict[TaskId, asyncio.Task[None]] = {}
        self._closings: dict[TaskId, asyncio.Task[None]] = {}
        self._paused: set[TopicPartition] = set()
        self._round_lock = asyncio.Lock()
        self._pool = (
            None
            if processing_threads <= 1
            else ThreadPoolExecutor(processing_threads, thread_name_prefix="keyrange-streams")
        )
        self._held_back: list[tuple[TopicPartition, Any, int]] = []
        self._work = asyncio.Event()
        self._outputs = Outputs(producer, state, self._gate, on_failure=self._work.set)
        self._stop = asyncio.get_running_loop().create_future()
        self._finishing = False
        self._commits = Commits(
            tasks=self.tasks,
            state=state,
            outputs=self._outputs,
            mark_processed=source.mark_processed,
            commit_offsets=commit,
            application_id=application_id,
            interval_s=commit_interval_s,
        )

    @property
    def failure(self) -> SendFailed | None:
        """The failed send that stops this instance, once one failed."""
        return self._outputs.failure

    # ------------------------------------------------------------------ Engine

    async def run(self) -> None:
        intake = asyncio.create_task(self._intake(), name="keyrange-streams-intake")
        try:
            await self._process_loop(intake)
        finally:
            if not self._stop.done():
                self._stop.set_result(None)
            intake.cancel()
            with contextlib.suppress(asyncio.CancelledError, FetchInterrupted, ConsumerStopped):
                await intake
            for restoring in self._restorations.values():
                restoring.cancel()
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def withdraw(self, slices: Slices | None) -> None:
        for task in self.tasks.in_slices(slices):
            revoked = None if slices is None else self.tasks.revoked_keys(task, slices)
            self._start_closing(task, revoked)

    def lose(self) -> None:
        """The membership is lost: no task takes another record (a pool thread inside one
        finishes the record it is on; a thread cannot be interrupted) and nothing held back
        is ours. ``drop_lost`` drops the tasks once the round under way has ended."""
        self._held_back.clear()
        for task in self.tasks:
            task.state = TaskState.HALTED

    async def stop_calls(self, slices: Slices) -> None:
        """Processing runs under the round lock, on the loop or on a pool thread, and a
        thread cannot be stopped: the revocation waits for the round (``revoked``)."""

    async def drop_lost(self) -> None:
        """Drop the tasks halted by ``lose``, without a commit, after the round under way:
        closing a task's processors or deleting its keys while a pool thread is inside it
        would race with that thread."""
        async with self._round_lock:
            for task in [task for task in self.tasks if task.state is TaskState.HALTED]:
                self._drop_task(task, processed_count=False)

    async def finish(self, timeout_s: float | None) -> None:
        self._finishing = True
        self._work.set()
        if not self._stop.done():
            self._stop.set_result(None)
        # A failed send is logged where it is seen and raised by ``StreamsApp.run`` once the
        # consumer committed what was marked before it and left.
        with contextlib.suppress(TimeoutError, SendFailed):
            async with asyncio.timeout(timeout_s), self._round_lock:
                await self._commits.flush_and_mark()

    def assigned(self) -> None:
        """Create the tasks of every owned slice that has none, so their restoration starts
        at the assignment rather than with the slice's first record."""
        for tp, keys, _ in self._owned():
            sub = self._topology.subtopology_of_topic(tp.topic)
            task_id = TaskId(sub.index, tp.partition, keys)
            if not self.tasks.overlapping(task_id):
                self._create(task_id)

    async def revoked(self, slices: Slices) -> None:
        """After the consumer committed a revocation: close the tasks and drop their keys;
        at shutdown keep the keys and checkpoint them, so a restart reads on from there."""
        tasks = self.tasks.in_slices(slices)
        failed: dict[TaskId, BaseException] = {}
        for task in tasks:
            closing = self._closings.get(task.id)
            if closing is not None:
                await asyncio.wait([closing])
                if not closing.cancelled() and closing.exception() is not None:
                    failed[task.id] = closing.exception()  # type: ignore[assignment]
        async with self._round_lock:
            self._close_revoked(tasks, slices, failed)
        # Raised to the consumer, which logs it: the records were given back, not committed.
        for error in failed.values():
            raise error

    def _close_revoked(
        self, tasks: list[StreamTask], slices: Slices, failed: dict[TaskId, BaseException]
    ) -> None:
        stopping = self._outputs.failure is not None
        for task in tasks:
            if stopping or task.id in failed:
                # Its store may hold writes whose changelog sends failed: its keys are deleted
                # and restored from the changelog by whoever takes them, this instance too.
                self._drop_task(task, processed_count=False)
                continue
            if self._finishing:
                task.close()
                self.tasks.remove(task)
                self._closings.pop(task.id, None)
                continue
            kept = subtract([task.id.keys], self.tasks.revoked_keys(task, slices))
            self._drop_task(task, processed_count=True, keep=kept)
        if stopping:
            held_back, self._held_back = self._held_back, []
            for _, record, _ in held_back:
                self._source.give_back(record)
            return
        if self._finishing:
            self._commits.write_checkpoints()
            return
        self.assigned()
        held_back, self._held_back = self._held_back, []
        for tp, record, hashed in held_back:
            heir = self._task_for(tp, hashed)
            if heir is None:
                self._source.give_back(record)
            else:
                heir.add(tp.topic, record)
        self._work.set()

    # ------------------------------------------------------------------ intake

    async def _intake(self) -> None:
        while True:
            tp, record, hashed = await self._source.next_item(self._stop)
            task = self._task_for(tp, hashed)
            if task is None:
                continue
            self._source.hand_out(tp, record, hashed)
            if task.state is TaskState.CLOSING:
                # Kept keys of a task closing for a partial revocation: its heir takes them.
                self._held_back.append((tp, record, hashed))
                continue
            task.add(tp.topic, record)
            if tp not in self._paused and task.inputs.crowded(tp.topic, self._max_buffered):
                self._paused.add(tp)
                self._source.pause([tp])
            self._work.set()

    def _task_for(self, tp: TopicPartition, hashed: int) -> StreamTask | None:
        task = self.tasks.find(tp, hashed)
        if task is not None:
            return task
        for owned_tp, keys, _ in self._owned():
            if owned_tp == tp and keys.contains(hashed):
                sub = self._topology.subtopology_of_topic(tp.topic)
                return self._create(TaskId(sub.index, tp.partition, keys))
        return None

    def _create(self, task_id: TaskId) -> StreamTask:
        sub = self._topology.subtopologies[task_id.subtopology]
        engines = {name: self._state.engine(name, task_id.partition) for name in sub.stores}
        task = StreamTask(
            task_id, self._topology, sub, engines, self._application_id, self._max_idle_ms
        )
        self._gate.grant(task, sub.source_topics[0])
        self.tasks.add(task)
        self._restorations[task_id] = asyncio.create_task(
            self._restore(task), name=f"keyrange-streams-restore-{task_id}"
        )
        logger.info("task created", extra={"task": str(task_id)})
        return task

    async def _restore(self, task: StreamTask) -> None:
        progress_list: list[RestoreProgress] = []
        self.restores[task.id] = progress_list
        for store in task.stores:
            spec = self._topology.stores[store]
            start = self._state.restore_from(store, task.id.partition, task.id.keys)
            progress = RestoreProgress(store, task.id.partition, [task.id.keys], start)
            progress_list.append(progress)
            await self._restorer.restore(
                spec.changelog_topic(self._application_id),
                progress,
                self._state.engine(store, task.id.partition),
                self._on_restore,
            )
            self._state.restored(store, task.id.partition, task.id.keys, progress.position)
            logger.info(
                "store restored",
                extra={
                    "task": str(task.id),
                    "store": store,
                    "records_read": progress.read,
                    "records_restored": progress.restored,
                    "seconds": round(progress.seconds, 3),
                },
            )
        self._restorations.pop(task.id, None)
        # A task closed or halted while it restored never runs: its processors stay uncreated.
        if task.state is TaskState.RESTORING:
            task.init()
        self._work.set()

    # ------------------------------------------------------------------ processing

    async def _process_loop(self, intake: asyncio.Task[None]) -> None:
        while not self._finishing:
            if intake.done():
                intake.result()
            if self._outputs.failure is not None:
                raise self._outputs.failure
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TICK_S):
                    await self._work.wait()
            self._work.clear()
            # Always yield once a round: heartbeats, the intake and restorations share the loop.
            await asyncio.sleep(0)
            async with self._round_lock:
                await self._round()
                await self._send()
                self._resume_drained()
                now_ms = int(time.time() * 1000)
                deadline = self._gate.round_deadline()
                for task in () if deadline is None else self._startable(deadline):
                    task.punctuate(WALL_CLOCK, now_ms)
                await self._send()
                if self._commits.due():
                    await self._commits.commit()

    async def _round(self) -> None:
        """Process ready tasks for up to one budget: round robin on the loop, or each task on
        a thread of the pool. Work is left flagged only when records remain after progress:
        a task waiting out an idle input is looked at again on the next tick, not in a loop
        that never yields."""
        session_deadline = self._gate.round_deadline()
        if session_deadline is None:
            # The session deadline passed (a frozen process, a blocked loop): asking has just
            # halted every task, and the keys may be another member's already.
            return
        now_ms = int(time.time() * 1000)
        # Each task's round is in the gate while it runs: a revocation of its keys waits.
        entered: list[tuple[StreamTask, Running]] = []
        for task in self._startable(session_deadline):
            running = self._gate.enter(task, self._home(task))
            if running is not None:
                entered.append((task, running))
        try:
            active = [task for task, _ in entered]
            if self._pool is None:
                progressed = _process_for(self._gate, active, now_ms, session_deadline)
            else:
                loop = asyncio.get_running_loop()
                busy = [task for task in active if task.inputs.buffered()]
                outcomes = await asyncio.gather(
                    *(
                        loop.run_in_executor(
                            self._pool, _process_for, self._gate, [task], now_ms, session_deadline
                        )
                        for task in busy
                    )
                )
                progressed = any(outcomes)
        finally:
            for _, running in entered:
                self._gate.exit(running)
        if progressed and any(task.inputs.buffered() for task in self._startable(session_deadline)):
            self._work.set()

    def _home(self, task: StreamTask) -> str:
        return self._topology.subtopologies[task.id.subtopology].source_topics[0]

    def _startable(self, deadline: float) -> list[StreamTask]:
        """The tasks whose records may start before ``deadline`` (the gate's rule)."""
        return [task for task in self.tasks if self._gate.may_start(task, deadline)]

    async def _send(self) -> None:
        await self._outputs.send(list(self.tasks.values()))

    async def commit(self) -> None:
        """Run the commit protocol (``client.streams.commits``) now."""
        await self._commits.commit()

    def _resume_drained(self) -> None:
        for tp in list(self._paused):
            holders = self.tasks.of_partition(tp)
            if all(task.inputs.drained(tp.topic, self._max_buffered) for task in holders):
                self._paused.discard(tp)
                self._source.resume([tp])

    # ------------------------------------------------------------------ revocation

    def _start_closing(self, task: StreamTask, revoked: list[KeyRange] | None) -> None:
        """Stop the task; its buffered records of revoked keys go back to the consumer, those
        of kept keys (a partial revocation) wait for the task that takes the rest over."""
        if task.state in (TaskState.CLOSING, TaskState.HALTED):
            # Closing already, or halted: the loss drops it, giving nothing back or marking it.
            return
        task.state = TaskState.CLOSING
        self._closings[task.id] = asyncio.ensure_future(self._close(task, revoked))

    async def _close(self, task: StreamTask, revoked: list[KeyRange] | None) -> None:
        """After the round under way (a pool thread may be running the task). When the
        flush fails, the task's processed records are given back unmarked, so the
        revocation commits none of them and does not wait for them."""
        try:
            async with self._round_lock:
                for record in task.inputs.drop(lambda _: False):
                    tp = TopicPartition(record.topic, record.partition)
                    hashed = key_hash(record.key, record.offset)
                    if revoked is None or any(keys.contains(hashed) for keys in revoked):
                        self._source.give_back(record)
                    else:
                        self._held_back.append((tp, record, hashed))
                try:
                    await self._commits.flush_and_mark([task])
                except BaseException:
                    processed, task.processed = task.processed, []
                    for record in processed:
                        self._source.give_back(record)
                    raise
        finally:
            restoring = self._restorations.pop(task.id, None)
            if restoring is not None:
                restoring.cancel()

    def _drop_task(
        self, task: StreamTask, *, processed_count: bool, keep: list[KeyRange] | None = None
    ) -> None:
        restoring = self._restorations.pop(task.id, None)
        if restoring is not None:
            restoring.cancel()
        self._closings.pop(task.id, None)
        task.close()
        self.tasks.remove(task)
        self.restores.pop(task.id, None)
        for store in task.stores:
            changelog = self._topology.stores[store].changelog_topic(self._application_id)
            offset = self._state.held_offset(store, task.id.partition, changelog)
            self._state.drop(
                self._application_id, store, task.id.partition, task.id.keys, delete=False
            )
            for keys in subtract([task.id.keys], keep or []):
                self._state.drop(self._application_id, store, task.id.partition, keys, delete=True)
            if processed_count:
                for keys in keep or []:
                    self._state.hold(store, task.id.partition, keys, offset)
        logger.info("task closed", extra={"task": str(task.id), "kept": len(keep or [])})


def _process_for(
    gate: TaskGate, tasks: list[StreamTask], now_ms: int, session_deadline: float
) -> bool:
    """Round robin over ``tasks`` for one budget, and not one record past the session
    deadline (DESIGN §5, the client half: the coordinator may give the keys away then, and
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
