"""The runtime's units: a lane (one sub-partition's queue and its task), an attempt (one record
from hand-out to its outcome, across retries) and the observer a task acknowledges through.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable

from aiokafka.structs import TopicPartition

from client.fetcher import Item
from client.runtime.gate import Lease, OwnershipGate, Running
from client.tracing import RecordSpan
from client.worker.task import WorkerTask

# A lane is a sub-partition: (partition, index); in the handler form, (partition, key hash).
LaneId = tuple[TopicPartition, int]
KeyId = tuple[TopicPartition, int]


class Lane:
    """A sub-partition: its records not handed out yet, in offset order, and the attempts of
    its records due to run again. ``busy`` while a call into its task runs; calls into one
    lane never overlap, so neither do calls into its task."""

    __slots__ = (
        "busy",
        "closed",
        "ident",
        "open",
        "punctuate_due",
        "queue",
        "refused",
        "retries",
        "scheduled",
        "task",
    )

    def __init__(self, ident: LaneId, task: WorkerTask) -> None:
        self.ident = ident
        self.task = task
        self.queue: deque[Item] = deque()
        self.retries: deque[Attempt] = deque()
        self.busy = False
        self.scheduled = False
        self.punctuate_due = False
        # The task's ``accept`` refused the head; asked again after the next event.
        self.refused = False
        # Attempts of this lane's records that have no outcome yet.
        self.open = 0
        # Set when the lane's task is to be closed; resolved once it was.
        self.closed: asyncio.Future[None] | None = None

    @property
    def idle(self) -> bool:
        return not (self.busy or self.queue or self.retries or self.open)


class Attempt:
    """A handed-out record until its outcome: processed, dead-lettered, skipped, or given
    back. ``number`` counts the calls to ``process`` so far. A pool's claim and slot
    (``client.runtime.pools.pool``): what its calls ask the gate, where a pool leaves how to
    end them."""

    __slots__ = (
        "calling",
        "dead_lettering",
        "first_failure_ms",
        "given_back_on_end",
        "item",
        "lane",
        "last_failure_ms",
        "lease",
        "number",
        "observer",
        "overdue",
        "stop",
        "timer",
        "trace",
        "weight",
        "withdrawn",
    )

    def __init__(self, item: Item, lane: Lane, weight: int, lease: Lease | None) -> None:
        self.item = item
        self.lane = lane
        self.weight = weight
        # The right its record was handed out under; the gate asks it before each call.
        self.lease = lease
        self.number = 0
        self.observer: Observer | None = None
        # The wait before the next try.
        self.timer: asyncio.TimerHandle | None = None
        # A call of ``process`` on it is under way (queued in a pool or running), and how to
        # end it (set by the pool while it can: ``client.runtime.pools``).
        self.calling = False
        self.stop: Callable[[], None] | None = None
        # It timed out while its call was under way: the outcome, once the call has ended.
        self.overdue: BaseException | None = None
        # Its slice was lost or revoked past the timeout while its call was under way: its
        # record goes back once the call has ended (no other record of the key runs before).
        self.given_back_on_end = False
        self.first_failure_ms = 0
        self.last_failure_ms = 0
        self.dead_lettering = False
        # Its slice was revoked or lost: a failure gives it back instead of retrying.
        self.withdrawn = False
        # Its span while tracing is on (``client.tracing``).
        self.trace: RecordSpan | None = None

    @property
    def key(self) -> KeyId:
        tp, _, hashed = self.item
        return tp, hashed

    def enter(self, gate: OwnershipGate) -> Running | None:
        """The pools' claim: its record may start only while its lease holds."""
        tp, record, hashed = self.item
        return gate.enter(self.lease, tp, hashed, record.offset)


class TaskAttempt(Attempt):
    """An attempt of the task form, whose task may acknowledge after ``process`` returned
    (``asyncio.create_task(self.bill(record, observer))``, docs/workers.md): its call is in
    the gate from its start until both ``process`` returned and the observer was answered,
    so a revocation, a timeout and a shutdown wait for the acknowledgement, or hold the key,
    as they do for a thread call still running."""

    __slots__ = ()

    def enter(self, gate: OwnershipGate) -> Running | None:
        tp, record, hashed = self.item
        observer = self.observer
        if observer is None:
            return gate.enter(self.lease, tp, hashed, record.offset)
        running = gate.enter(self.lease, tp, hashed, record.offset, ends=2)
        observer.running = running
        return running


Resolve = Callable[["Observer", BaseException | None], None]


class Observer:
    """One attempt's acknowledgement. Callable from any thread: the outcome is handed to the
    event loop, where the first one counts and later ones are ignored."""

    __slots__ = ("_loop", "_resolve", "_thread", "attempt", "deferred", "resolved", "running")

    def __init__(self, attempt: Attempt, resolve: Resolve, loop: asyncio.AbstractEventLoop) -> None:
        self.attempt: Attempt | None = attempt
        self.resolved = False
        # A task's call in the gate until this observer is answered (``TaskAttempt``), and
        # the attempt whose ``process`` returned before the answer: its call lasts until it.
        self.running: Running | None = None
        self.deferred: Attempt | None = None
        self._resolve = resolve
        self._loop = loop
        self._thread = threading.get_ident()

    def success(self) -> None:
        self._report(None)

    def failure(self, error: BaseException) -> None:
        if not isinstance(error, BaseException):
            error = TypeError(f"observer.failure() takes an exception, got {error!r}")
        self._report(error)

    def _report(self, error: BaseException | None) -> None:
        if threading.get_ident() == self._thread:
            self._resolve(self, error)
            return
        # A closed loop means the worker stopped; the record was not committed, so it is
        # delivered again after a restart.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._resolve, self, error)
