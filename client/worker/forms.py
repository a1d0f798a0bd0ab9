"""The worker's two forms, one chosen when the runtime is made; the runtime asks its form
wherever they differ and never which form it has.

* ``HandlerForm``: a lane per key (partition, key hash), all served by one stateless task
  whose ``process`` is the handler's (on the loop, the thread pool or the process pool,
  ``Calls.handler_process``); a key's lane goes once nothing of it is left, and there is
  nothing to punctuate, accept or close.
* ``TaskForm``: a lane per sub-partition (the partitioner's), each with a task instance of
  its own, created when its partition is owned (or its first record comes) and closed when
  the partition is not owned any more; the task's ``accept``, ``punctuate`` and ``close`` are
  called where it overrides them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from aiokafka.structs import TopicPartition

from client.fetcher import Item, Record
from client.worker.calls import Calls, overrides
from client.worker.config import WorkerConfig
from client.worker.failures import WorkerFailed
from client.worker.lanes import Attempt, Lane, LaneId, Observer, TaskAttempt
from client.worker.task import Partitioner, SubPartition, WorkerTask

logger = logging.getLogger(__name__)

Process = Callable[[WorkerTask, Attempt, Observer], Awaitable[None]]


class Form(Protocol):
    """What differs between the handler form and the task form."""

    @property
    def process(self) -> Process:
        """One call of user code on an attempt's record (through the ownership gate)."""

    # Whether a task may punctuate at all (the punctuation loop ends at once otherwise).
    punctuates: bool

    @property
    def attempt(self) -> type[Attempt]:
        """What a handed-out record becomes: a task's may be acknowledged after its call."""

    def lane_id(self, item: Item) -> LaneId:
        """The lane a record goes to; ``WorkerFailed`` if the partitioner is wrong."""

    def new_task(self, ident: LaneId) -> WorkerTask:
        """The task of a new lane; ``WorkerFailed`` if it could not be made."""

    def lanes_of(self, tp: TopicPartition) -> Iterable[LaneId]:
        """The lanes created as soon as ``tp`` is owned."""

    def accepts(self, task: WorkerTask, record: Record) -> bool:
        """Whether ``task`` takes ``record`` now; ``WorkerFailed`` if asking it failed."""

    def calls(self, task: WorkerTask, method: str) -> bool:
        """Whether the runtime calls ``task``'s ``method`` (``punctuate``, ``close``)."""

    async def call(self, lane: Lane, method: str, *args: Any) -> None:
        """``method`` of the lane's task if it is called at all; a failure is logged."""

    def drops(self, lane: Lane) -> bool:
        """Whether ``lane`` goes now that it may be idle (a key with nothing left)."""

    def closed_at_shutdown(self, lanes: Iterable[Lane]) -> list[Lane]:
        """The lanes whose tasks the shutdown closes."""


class HandlerForm:
    """Every key its own lane, one shared stateless task calling the handler."""

    punctuates = False
    attempt = Attempt

    def __init__(self, process: Process) -> None:
        self.process = process
        self._shared = WorkerTask()

    def lane_id(self, item: Item) -> LaneId:
        tp, _, hashed = item
        return tp, hashed

    def new_task(self, ident: LaneId) -> WorkerTask:
        return self._shared

    def lanes_of(self, tp: TopicPartition) -> Iterable[LaneId]:
        return ()

    def accepts(self, task: WorkerTask, record: Record) -> bool:
        return True

    def calls(self, task: WorkerTask, method: str) -> bool:
        return False

    async def call(self, lane: Lane, method: str, *args: Any) -> None:
        return None

    def drops(self, lane: Lane) -> bool:
        return lane.idle

    def closed_at_shutdown(self, lanes: Iterable[Lane]) -> list[Lane]:
        return []


class TaskForm:
    """A task instance per sub-partition, made by ``factory``."""

    punctuates = True
    attempt = TaskAttempt

    def __init__(
        self,
        factory: Callable[[], WorkerTask],
        partitioner: Partitioner,
        config: WorkerConfig,
        calls: Calls,
    ) -> None:
        self._factory = factory
        self._partitioner = partitioner
        self._config = config
        self._calls = calls

    async def process(self, task: WorkerTask, attempt: Attempt, observer: Observer) -> None:
        await self._calls.for_record(attempt, task.process, attempt.item[1], observer)

    def lane_id(self, item: Item) -> LaneId:
        tp, record, hashed = item
        index = self._partitioner.subpartition(record, hashed)
        count = self._partitioner.count(tp)
        if not 0 <= index < count:
            raise WorkerFailed(f"the partitioner gave sub-partition {index} of {count}")
        return tp, index

    def new_task(self, ident: LaneId) -> WorkerTask:
        tp, index = ident
        try:
            task = self._factory()
            task.init(
                SubPartition(tp.topic, tp.partition, index, self._partitioner.count(tp)),
                self._config,
            )
        except Exception as error:
            logger.exception("task init failed", extra={"topic": tp.topic, "index": index})
            raise WorkerFailed(f"task init failed: {error!r}") from error
        return task

    def lanes_of(self, tp: TopicPartition) -> Iterable[LaneId]:
        return [(tp, index) for index in range(self._partitioner.count(tp))]

    def accepts(self, task: WorkerTask, record: Record) -> bool:
        if not overrides(task, "accept"):
            return True
        try:
            return task.accept(record)
        except Exception as error:
            raise WorkerFailed(f"task accept failed: {error!r}") from error

    def calls(self, task: WorkerTask, method: str) -> bool:
        return overrides(task, method)

    async def call(self, lane: Lane, method: str, *args: Any) -> None:
        if not overrides(lane.task, method):
            return
        try:
            await self._calls.call(getattr(lane.task, method), *args)
        except Exception:
            tp, index = lane.ident
            logger.exception(
                f"task {method} failed",
                extra={"topic": tp.topic, "partition": tp.partition, "index": index},
            )

    def drops(self, lane: Lane) -> bool:
        return False

    def closed_at_shutdown(self, lanes: Iterable[Lane]) -> list[Lane]:
        return list(lanes)
