"""Opening and dropping the runtime's tasks. A task opens when its slice is assigned (or with
its first record): it is created with the lease of its slice, its stores restore from their
changelogs as an asyncio task of their own (only this task waits; the others go on), and its
processors are created once every store is restored. Dropping a task closes its processors
and drops its keys from its stores, except the keys a partial revocation kept, whose
changelog position is held for the task that takes them over."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange, subtract
from client.streams.cache import CacheBudget
from client.streams.gate import TaskGate
from client.streams.ports import StoreRestorer
from client.streams.restore import RestoreProgress
from client.streams.restoring import StoreRestore, restore_store
from client.streams.state import StateManager
from client.streams.task import StreamTask, TaskId, TaskState
from client.streams.tasks import Tasks
from client.streams.topology import BuiltTopology
from client.tracing import RecordTracer

logger = logging.getLogger(__name__)

Starts = Callable[[TopicPartition, KeyRange], list[tuple[KeyRange, int]]]


def _nothing_before(_: TaskId) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Opening:
    """What the application tells the opening of a task: ``before`` is called before its
    restore starts (a standby of its keys stops there); ``starts`` says where its processing
    of a topic starts, per part of its keys (the consumer's ``slice_starts``): a source-topic
    table restores up to there, and to the topic's end without it."""

    before: Callable[[TaskId], None] = _nothing_before
    starts: Starts | None = None


class Lifecycle:
    def __init__(
        self,
        *,
        tasks: Tasks,
        topology: BuiltTopology,
        application_id: str,
        state: StateManager,
        gate: TaskGate,
        restorer: StoreRestorer,
        on_restore: Callable[[RestoreProgress], None],
        max_idle_ms: int,
        on_ready: Callable[[], None],
        tracer: RecordTracer | None = None,
        cache: CacheBudget | None = None,
        opening: Opening | None = None,
    ) -> None:
        self._opening = opening or Opening()
        self._tracer = tracer
        self._cache = cache
        self._tasks = tasks
        self._topology = topology
        self._application_id = application_id
        self._state = state
        self._gate = gate
        self._restorer = restorer
        self._on_restore = on_restore
        self._max_idle_ms = max_idle_ms
        self._on_ready = on_ready
        self.restores: dict[TaskId, list[RestoreProgress]] = {}
        # Handles to cancel; where a task is in its life is its ``state``.
        self._restorations: dict[TaskId, asyncio.Task[None]] = {}

    def open(self, task_id: TaskId) -> StreamTask:
        self._opening.before(task_id)
        sub = self._topology.subtopologies[task_id.subtopology]
        backends = {name: self._state.backend(name, task_id.partition) for name in sub.stores}
        task = StreamTask(
            task_id,
            self._topology,
            sub,
            backends,
            self._application_id,
            self._max_idle_ms,
            self._cache,
        )
        task.tracer = self._tracer
        self._gate.grant(task, sub.source_topics[0])
        self._tasks.add(task)
        restoring = asyncio.create_task(
            self._restore(task), name=f"keyrange-streams-restore-{task_id}"
        )
        restoring.add_done_callback(_report_failure)
        self._restorations[task_id] = restoring
        logger.info("task created", extra={"task": str(task_id)})
        return task

    def stop_restoring(self, task: StreamTask) -> None:
        restoring = self._restorations.pop(task.id, None)
        if restoring is not None:
            restoring.cancel()

    def stop_all(self) -> None:
        for restoring in self._restorations.values():
            restoring.cancel()

    def forget(self, task: StreamTask) -> None:
        """Close the task's processors and leave its stores as they are (a shutdown keeps
        every key, for a restart to read on from the checkpoints)."""
        task.close()
        self._tasks.remove(task)

    def drop(
        self, task: StreamTask, *, processed_count: bool, keep: list[KeyRange] | None = None
    ) -> None:
        self.stop_restoring(task)
        task.close()
        self._tasks.remove(task)
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

    async def _restore(self, task: StreamTask) -> None:
        progress_list: list[RestoreProgress] = []
        self.restores[task.id] = progress_list
        for store in task.stores:
            progress = RestoreProgress(store, task.id.partition, [task.id.keys], 0)
            progress_list.append(progress)
            job = StoreRestore(
                str(task.id),
                self._application_id,
                store,
                self._topology.stores[store],
                task.id.partition,
                task.id.keys,
                self._source_starts(store, task.id),
            )
            await restore_store(job, progress, self._restorer, self._state, self._on_restore)
            self._state.restored(store, task.id.partition, task.id.keys, progress.position)
            logger.info(
                "store restored",
                extra={
                    "task": str(task.id),
                    "store": store,
                    "start_offset": progress.start_offset,
                    "records_read": progress.read,
                    "records_restored": progress.restored,
                    "seconds": round(progress.seconds, 3),
                },
            )
        self._restorations.pop(task.id, None)
        # A task closed or halted while it restored never runs: its processors stay uncreated.
        if task.state is TaskState.RESTORING:
            task.init()
        self._on_ready()

    def _source_starts(
        self, store: str, task_id: TaskId
    ) -> tuple[tuple[KeyRange, int], ...] | None:
        """Where the task's processing of a source-topic table's topic starts, per part of
        its keys; None for another store, or when no slice of the topic holds the keys (the
        task takes none of the topic's records: the table is restored to its end)."""
        topic = self._topology.stores[store].source_topic
        if topic is None or self._opening.starts is None:
            return None
        starts = self._opening.starts(TopicPartition(topic, task_id.partition), task_id.keys)
        return tuple(starts) if starts else None


def _report_failure(restoring: asyncio.Task[None]) -> None:
    """A restore that ended in an exception (the store restores retry theirs: this is a
    task's processors failing to start) is logged, never left for the collector to drop."""
    if not restoring.cancelled() and (error := restoring.exception()) is not None:
        logger.error(
            "task not started after its restore",
            extra={"restore": restoring.get_name()},
            exc_info=error,
        )
