"""The streams runtime: what ``KeyrangeConsumer.drive`` runs for a ``StreamsApp``.

Two long-lived routines, one per concern, as in the Streams threading design: the kernel's
intake (``client.runtime.intake``) takes records from the consumer, charges them to the byte
budget (``client.streams.backpressure`` refunds them) and buffers each in its task (tasks are
created, and their restoration started, when their slices are assigned), and the processing
loop runs the ready tasks round robin (on the loop, or each on a thread of the processing pool),
sends what they produced, fires wall-clock punctuations and commits (the protocol's steps:
``client.streams.commits``); one lock keeps a round, a commit and a task's closing apart.
Restorations run as their own tasks on a restore consumer of their own: only the restoring
task waits, the others go on.

Records start in user code, and outputs go to the producer, only through the ownership gate
(``client.streams.gate``). Ownership changes and the stop arrive through the lifecycle hooks
(``client.runtime.hooks``), with which ``StreamsApp`` registers the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka.structs import TopicPartition

from client.http import Slices
from client.protocol.keyspace import KeyRange, in_ranges, key_hash, subtract
from client.runtime.hooks import LifecycleHooks
from client.runtime.intake import Intake
from client.streams.backpressure import InputBudget
from client.streams.cache import CacheBudget
from client.streams.commits import Commits
from client.streams.errors import SendFailed
from client.streams.gate import TaskGate
from client.streams.lifecycle import Lifecycle, Opening
from client.streams.outputs import Outputs
from client.streams.ports import Producer, StoreRestorer, StreamSource
from client.streams.processor import WALL_CLOCK
from client.streams.restore import RestoreProgress
from client.streams.rounds import Rounds
from client.streams.state import StateManager
from client.streams.task import StreamTask, TaskId, TaskState
from client.streams.tasks import Tasks
from client.streams.topology import BuiltTopology
from client.tracing import RecordTracer

logger = logging.getLogger(__name__)

# How often an idle processing loop wakes for wall-clock punctuations and the commit timer.
_TICK_S = 0.05


class StreamsRuntime(LifecycleHooks):
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
        max_buffered_bytes: int,
        processing_threads: int,
        cache_max_bytes: int = 0,
        max_buffered_records: int | None = None,
        on_restore: Callable[[RestoreProgress], None],
        tracer: RecordTracer | None = None,
        opening: Opening | None = None,
    ) -> None:
        self._source, self._topology = source, topology
        self._gate = gate = TaskGate(source.gate, source.may_hand_out, source.session_deadline)
        self._owned = owned
        self.inputs = InputBudget(source, max_buffered_bytes, max_buffered_records)
        self._intake = Intake(source, self._take, self.inputs.budget)
        self.tasks = Tasks(topology)
        self._work = asyncio.Event()
        self._life = Lifecycle(
            tasks=self.tasks,
            topology=topology,
            application_id=application_id,
            state=state,
            gate=gate,
            restorer=restorer,
            on_restore=on_restore,
            max_idle_ms=max_idle_ms,
            on_ready=self._work.set,
            tracer=tracer,
            cache=CacheBudget(cache_max_bytes) if cache_max_bytes > 0 else None,
            opening=opening,
        )
        self.restores = self._life.restores
        self._rounds = Rounds(self.tasks, topology, gate, processing_threads, self._work)
        # Handles to wait for; where a task is in its life is its ``state``.
        self._closings: dict[TaskId, asyncio.Task[None]] = {}
        self._round_lock = asyncio.Lock()
        self._held_back: list[tuple[TopicPartition, Any, int]] = []
        wake = self._work.set
        self._outputs = Outputs(producer, state, gate, on_failure=wake, wake=wake)
        self._stop = asyncio.get_running_loop().create_future()
        self._finishing = False
        # Once ``run`` ended by itself (a failed processor or send), ``revoking``, ``lost`` and
        # ``stopping`` do nothing: nothing past the last commit is flushed or marked, and the
        # consumer's final ``revoked`` drops the tasks and their keys.
        self._ended = False
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

    # ------------------------------------------------------------------ Runtime

    async def run(self) -> None:
        intake = asyncio.create_task(self._intake.run(self._stop), name="keyrange-streams-intake")
        try:
            await self._process_loop(intake)
        finally:
            if not self._stop.done():
                self._stop.set_result(None)
            intake.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await intake
            self._life.stop_all()
            self._rounds.shutdown()
            self._ended = True

    def revoking(self, slices: Slices) -> None:
        """Start closing the slices' tasks: nothing of them starts any more, their buffered
        records go back (``_start_closing``)."""
        if self._ended:
            return
        for task in self.tasks.in_slices(slices):
            self._start_closing(task, self.tasks.revoked_keys(task, slices))

    def lost(self, slices: Slices) -> None:
        """The membership is lost: no task takes another record (a pool thread inside one
        finishes the record it is on; a thread cannot be interrupted) and nothing held back
        is ours. ``dropped`` drops the tasks once the round under way has ended."""
        if self._ended:
            return
        held_back, self._held_back = self._held_back, []
        for tp, record, _ in held_back:
            self.inputs.refund(tp, record)
        for task in self.tasks:
            task.state = TaskState.HALTED

    async def stop_calls(self, slices: Slices) -> None:
        """Processing runs under the round lock, on the loop or on a pool thread, and a
        thread cannot be stopped: the revocation waits for the round (``revoked``)."""

    async def dropped(self, slices: Slices) -> None:
        """Drop the tasks halted by ``lost``, without a commit, after the round under way:
        closing a task's processors or deleting its keys while a pool thread is inside it
        would race with that thread."""
        async with self._round_lock:
            for task in [task for task in self.tasks if task.state is TaskState.HALTED]:
                self._drop(task, processed_count=False)

    async def stopping(self, timeout_s: float | None) -> None:
        if self._ended:
            return
        self._finishing = True
        self._work.set()
        if not self._stop.done():
            self._stop.set_result(None)
        # A failed send is logged where it is seen and raised by ``StreamsApp.run`` once the
        # consumer committed what was marked before it and left.
        with contextlib.suppress(TimeoutError, SendFailed):
            async with asyncio.timeout(timeout_s), self._round_lock:
                await self._commits.flush_and_mark()

    def assigned(self, slices: Slices) -> None:
        """Create the tasks of every owned slice that has none, so their restoration starts
        at the assignment rather than with the slice's first record; the owned partitions
        share the byte budget."""
        self._open_owned()

    def _open_owned(self) -> None:
        owned = self._owned()
        self.inputs.owned(owned)
        for tp, keys, _ in owned:
            sub = self._topology.subtopology_of_topic(tp.topic)
            task_id = TaskId(sub.index, tp.partition, keys)
            if not self.tasks.overlapping(task_id):
                self._life.open(task_id)

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
                self._drop(task, processed_count=False)
                continue
            if self._finishing:
                self._closings.pop(task.id, None)
                self.inputs.drop(task)
                self._life.forget(task)
                continue
            kept = subtract([task.id.keys], self.tasks.revoked_keys(task, slices))
            self._drop(task, processed_count=True, keep=kept)
        if stopping:
            held_back, self._held_back = self._held_back, []
            for tp, record, _ in held_back:
                self.inputs.give_back(tp, record)
            return
        if self._finishing:
            self._commits.write_checkpoints()
            return
        self._open_owned()
        held_back, self._held_back = _in_log_order(self._held_back), []
        for tp, record, hashed in held_back:
            heir = self._task_for(tp, hashed)
            if heir is None:
                self.inputs.give_back(tp, record)
            else:
                heir.add(tp.topic, record)
        self._work.set()

    # ------------------------------------------------------------------ intake

    def _take(self, item: tuple[TopicPartition, Any, int]) -> None:
        """Buffer a record the intake took in (and charged) in its task; it stays charged
        until the task processed it, or it is given back or dropped."""
        tp, record, hashed = item
        task = self._task_for(tp, hashed)
        if task is None:
            self.inputs.refund(tp, record)
            return
        self._source.hand_out(tp, record, hashed)
        if task.state is TaskState.CLOSING:
            # Kept keys of a task closing for a partial revocation: its heir takes them.
            self._held_back.append(item)
            return
        task.add(tp.topic, record)
        self._work.set()

    def _task_for(self, tp: TopicPartition, hashed: int) -> StreamTask | None:
        task = self.tasks.find(tp, hashed)
        if task is not None:
            return task
        for owned_tp, keys, _ in self._owned():
            if owned_tp == tp and keys.contains(hashed):
                sub = self._topology.subtopology_of_topic(tp.topic)
                return self._life.open(TaskId(sub.index, tp.partition, keys))
        return None

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
                await self._rounds.run()
                self.inputs.processed(self.tasks)
                await self._outputs.send(list(self.tasks.values()))
                now_ms = int(time.time() * 1000)
                deadline = self._gate.round_deadline()
                for task in () if deadline is None else self._rounds.startable(deadline):
                    task.punctuate(WALL_CLOCK, now_ms)
                await self._outputs.send(list(self.tasks.values()))
                if self._commits.due():
                    await self._commits.commit()

    async def commit(self) -> None:
        """Run the commit protocol (``client.streams.commits``) now."""
        await self._commits.commit()

    # ------------------------------------------------------------------ revocation

    def _start_closing(self, task: StreamTask, revoked: list[KeyRange]) -> None:
        """Stop the task; its buffered records of revoked keys go back to the consumer, those
        of kept keys (a partial revocation) wait for the task that takes the rest over."""
        if task.id in self._closings:
            return
        # A halted task stays halted: closing it gives its buffered records back and marks
        # nothing (its keys may be another member's).
        if task.state is not TaskState.HALTED:
            task.state = TaskState.CLOSING
        self._closings[task.id] = asyncio.ensure_future(self._close(task, revoked))

    async def _close(self, task: StreamTask, revoked: list[KeyRange]) -> None:
        """After the round under way (a pool thread may be running the task). When the
        flush fails, the task's processed records are given back unmarked, so the
        revocation commits none of them and does not wait for them."""
        try:
            async with self._round_lock:
                for record in task.inputs.drop(lambda _: False):
                    tp = TopicPartition(record.topic, record.partition)
                    hashed = key_hash(record.key, record.offset)
                    if in_ranges(revoked, hashed):
                        self.inputs.give_back(tp, record)
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
            self._life.stop_restoring(task)

    def _drop(
        self, task: StreamTask, *, processed_count: bool, keep: list[KeyRange] | None = None
    ) -> None:
        self._closings.pop(task.id, None)
        self.inputs.drop(task)
        self._life.drop(task, processed_count=processed_count, keep=keep)


def _in_log_order(
    held: list[tuple[TopicPartition, Any, int]],
) -> list[tuple[TopicPartition, Any, int]]:
    """The records a partial revocation kept, in log order for their heirs: those taken in
    while the task waited to close were held back before the older ones it still buffered,
    and an heir processing a later offset first moves its stream time past the older
    records' windows, which then drop them as late."""
    return sorted(held, key=lambda item: (item[0].topic, item[0].partition, item[1].offset))
