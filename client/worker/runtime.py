"""The worker runtime: records routed to lanes (the form's: a sub-partition each, or
in the handler form a key each, ``client.worker.forms``), lanes served by a fixed pool of
``max_concurrency`` runners apart from the fetch, acknowledgements turned into marks (the
consumer's tracker then commits watermarks and IC ranges), failures into the policy's next
step (``client.worker.outcomes``), and buffered bytes into pause and resume of the
partitions' fetching.

Ordering rules, enforced here (by ``Scheduler``) and nowhere else:

* a lane hands its records to its task in offset order, one call at a time;
* a record is not handed out while an earlier record of its key (partition, key hash) has no
  outcome yet: it may be in processing, waiting for its acknowledgement, waiting to be tried
  again or on its way to the dead-letter topic;
* a lane waits behind its head; other lanes (and, in the handler form, where every key is
  its own lane, other keys) keep flowing.

Lanes take turns through one ready queue, each at most once in it, so a lane with many
records does not starve the others (the backlog-driven scheduling of the Kafka Streams
threading design, with a turn of one call).

The other parts are modules of their own: the calls' processing timeouts
(``client.worker.timeouts``), the tasks' opening, punctuation and closing
(``client.worker.partitions``), the runtime's phase (``client.worker.lifecycle``), and below
them lanes and attempts, pools and dead letters; the intake and the byte budget are the
kernel's (``client.runtime``). ``WorkerRuntime`` is what the consumer drives: the fetch, and
the lifecycle hooks (``client.runtime.hooks``) through which it hears ownership changes and
the shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

from aiokafka.structs import TopicPartition

from client.fetcher import Item, in_slices
from client.http import Slices
from client.runtime.budget import ByteBudget, weight
from client.runtime.hooks import LifecycleHooks
from client.runtime.intake import Intake
from client.runtime.pools.pool import NotStarted, Stopped
from client.runtime.seams import WorkerSource
from client.tracing import RecordTracer
from client.worker.calls import Calls
from client.worker.config import WorkerConfig
from client.worker.deadletter import DeadLetters
from client.worker.failures import WorkerFailed
from client.worker.forms import Form, HandlerForm, Process, TaskForm
from client.worker.lanes import Attempt, KeyId, Lane, LaneId, Observer
from client.worker.lifecycle import Lifecycle, Phase
from client.worker.outcomes import Failures, Stats
from client.worker.partitions import PartitionTasks
from client.worker.task import KeyHashPartitioner, Partitioner, WorkerTask
from client.worker.timeouts import Timeouts

logger = logging.getLogger(__name__)


class Scheduler:
    """The state the ordering rules govern (the lanes, the keys with an open record, the
    lanes waiting for a key, the attempts without an outcome) and the workers' turns: which
    lane is served next, and what its turn does."""

    def __init__(
        self,
        source: WorkerSource,
        config: WorkerConfig,
        form: Form,
        lifecycle: Lifecycle,
        budget: ByteBudget,
        stats: Stats,
        dead_letters: DeadLetters | None,
        tracer: RecordTracer | None = None,
    ) -> None:
        self._source = source
        self._tracer = tracer
        self._form = form
        self._lifecycle = lifecycle
        self._budget = budget
        self._stats = stats
        self._loop = asyncio.get_running_loop()
        self.lanes: dict[LaneId, Lane] = {}
        self.open: dict[KeyId, Attempt] = {}
        self.waiting: dict[KeyId, list[Lane]] = {}
        self.attempts: set[Attempt] = set()
        # Set while no attempt is without an outcome.
        self.settled = asyncio.Event()
        self.settled.set()
        self._ready: asyncio.Queue[Lane | None] = asyncio.Queue()
        self.failures = Failures(config, source, dead_letters, lifecycle, self, stats)
        self.timeouts = Timeouts(config.processing_timeout_s, self._loop, self.resolve)
        self.tasks = PartitionTasks(self, form, lifecycle, config, self._loop)
        # Where an observer's answer goes: a task's, which may come after its call, first
        # ends the call's wait in the gate.
        self._answered = self.acknowledged if form.attempt is not Attempt else self.resolve

    def new_lane(self, ident: LaneId) -> Lane | None:
        try:
            task = self._form.new_task(ident)
        except WorkerFailed as error:
            self._lifecycle.fail(error)
            return None
        lane = self.lanes[ident] = Lane(ident, task)
        return lane

    def schedule(self, lane: Lane) -> None:
        if lane.busy or lane.scheduled or self._lifecycle.finished:
            return
        if lane.closed is not None:
            if not lane.closed.done():
                lane.scheduled = True
                self._ready.put_nowait(lane)
            return
        if lane.punctuate_due or lane.retries:
            lane.scheduled = True
            self._ready.put_nowait(lane)
            return
        if not lane.queue or lane.refused or self._lifecycle.stopping:
            return
        tp, _, hashed = lane.queue[0]
        key = (tp, hashed)
        if key in self.open:
            waiting = self.waiting.setdefault(key, [])
            if lane not in waiting:
                waiting.append(lane)
            return
        lane.scheduled = True
        self._ready.put_nowait(lane)

    async def work(self) -> None:
        """One of the runtime's runners: serves lanes until told to exit."""
        while True:
            lane = await self._ready.get()
            if lane is None:
                return
            lane.scheduled = False
            lane.busy = True
            try:
                await self._serve(lane)
            finally:
                lane.busy = False
            self._after_turn(lane)

    def stop_workers(self, count: int) -> None:
        for _ in range(count):
            self._ready.put_nowait(None)

    def _after_turn(self, lane: Lane) -> None:
        if lane.closed is None and self._form.drops(lane):
            # The handler form's lanes are keys: gone once nothing of theirs is left.
            self.lanes.pop(lane.ident, None)
        else:
            self.schedule(lane)

    async def _serve(self, lane: Lane) -> None:
        """One turn of a lane: close its task, punctuate, try a record again, or hand out
        the next record."""
        if lane.closed is not None:
            await self.tasks.close_task(lane)
            return
        if lane.punctuate_due:
            lane.punctuate_due = False
            lane.refused = False
            await self._form.call(lane, "punctuate", time.time())
            return
        if lane.retries:
            # Asked before a retry too: a lost session gives the record back instead.
            if self._source.may_hand_out():
                await self._attempt(lane.retries.popleft())
            return
        if not lane.queue or self._lifecycle.stopping:
            return
        item = lane.queue[0]
        tp, record, hashed = item
        if (tp, hashed) in self.open:
            return
        try:
            accepted = self._form.accepts(lane.task, record)
        except WorkerFailed as error:
            self._lifecycle.fail(error)
            return
        if not accepted:
            lane.refused = True
            return
        if not self._source.may_hand_out():
            return  # the membership is lost; ``lost`` drops what is queued
        lane.queue.popleft()
        lease = self._source.hand_out(tp, record, hashed)
        attempt = self._form.attempt(item, lane, weight(record), lease)
        if self._tracer is not None:
            attempt.trace = self._tracer.start(tp.topic, tp.partition, record, hashed)
        self.open[(tp, hashed)] = attempt
        self.attempts.add(attempt)
        self.settled.clear()
        lane.open += 1
        await self._attempt(attempt)

    async def _attempt(self, attempt: Attempt) -> None:
        """One call of ``process``, awaited in this worker, so no other record of the lane
        (of the key, in the handler form) starts before it has ended. A call that has not
        started, or runs on the loop or in a process, is ended when its record times out or
        its slice must go (``Attempt.stop``); a call running on a thread cannot be, and the
        record's outcome waits for it. A task's call that returned before it acknowledged
        lasts until the acknowledgement (``acknowledged``), which nothing can stop either."""
        attempt.number += 1
        if attempt.trace is not None:
            attempt.trace.attempt(attempt.number)
        observer = Observer(attempt, self._answered, self._loop)
        attempt.observer = observer
        self.timeouts.start(observer)
        attempt.calling = True
        deferred = False
        try:
            await self._form.process(attempt.lane.task, attempt, observer)
            deferred = observer.running is not None
        except Stopped:
            # Stopped by its timeout, a loss or a revocation past the drain, which decide
            # what follows once the call has ended (``_call_ended``); no answer comes now.
            self._call_over(observer)
        except asyncio.CancelledError:
            # The worker itself is cancelled (the end of a shutdown): as stopped.
            self._call_over(observer)
            raise
        except NotStarted:
            if attempt.observer is observer and attempt.overdue is None:
                self._not_started(attempt)
        except Exception as error:
            observer.failure(error)
        finally:
            attempt.stop = None
            if not deferred:
                attempt.calling = False
        if deferred:
            observer.deferred = attempt
            return
        self._call_ended(attempt, observer)

    def acknowledged(self, observer: Observer, error: BaseException | None) -> None:
        """The task answered through ``observer`` (the task form's ``Observer`` reports
        here): its call is over once ``process`` returned too, and when ``process``
        returned first, what waited for the call (a timeout's outcome, giving the record
        back) happens now."""
        if observer.running is not None:
            self._call_over(observer)
            attempt = observer.deferred
            if attempt is not None:
                observer.deferred = None
                attempt.calling = False
                self.resolve(observer, error)
                self._call_ended(attempt, observer)
                return
        self.resolve(observer, error)

    def _call_over(self, observer: Observer) -> None:
        """No answer through ``observer`` is waited for any more: its end in the gate."""
        running, observer.running = observer.running, None
        if running is not None:
            self._source.gate.exit(running)

    def _call_ended(self, attempt: Attempt, observer: Observer) -> None:
        """What waited for the call to end: a timeout's outcome, or giving the record back
        after its slice was lost or revoked past the timeout."""
        if attempt.overdue is not None:
            overdue, attempt.overdue = attempt.overdue, None
            if attempt.observer is observer:
                self.resolve(observer, overdue)
                return
        if attempt.given_back_on_end:
            attempt.given_back_on_end = False
            self.give_back(attempt)

    def _not_started(self, attempt: Attempt) -> None:
        """A pool did not start the record: its right to start had ended when its turn came,
        or its call was stopped first. No call of ``process`` happened, so nothing counts it
        as a failure, retries or dead-letters it. Asking the hand-out guard notices a loss
        the pool saw, and the loss gives the record back with everything else; a record
        whose key is still ours (a heartbeat answered after the deadline the pool read, a
        revocation of another slice or of another part of its own) is sent again, first in
        its lane. A partial revocation ends the lease of the whole slice it cuts, so a
        record of the kept part goes again under the kept part's new lease: given back, it
        would wait for this member's restart while the member lives on, holding its
        slice's commit point below it."""
        attempt.number -= 1
        detach(attempt)
        if not self._source.may_hand_out():
            return
        if attempt.withdrawn or self._lifecycle.stopping or attempt.lease is None:
            self.give_back(attempt)
            return
        if not attempt.lease.valid:
            tp, _, hashed = attempt.item
            attempt.lease = self._source.gate.lease(tp, hashed)
            if attempt.lease is None:
                self.give_back(attempt)
                return
        attempt.lane.retries.appendleft(attempt)

    def resolve(self, observer: Observer, error: BaseException | None) -> None:
        if observer.resolved:
            return
        observer.resolved = True
        attempt = observer.attempt
        # Detached, so an observer user code keeps (or a deadline entry) holds no record.
        observer.attempt = None
        if attempt is None or attempt.observer is not observer:
            return
        attempt.observer = None
        if error is None:
            self._stats.processed += 1
            self.settle(attempt, processed=True)
        else:
            self.failures.failed(attempt, error)

    def settle(self, attempt: Attempt, *, processed: bool) -> None:
        """The attempt's record has its outcome: mark it (or give it back), open its key."""
        if attempt not in self.attempts:
            return
        self.forget(attempt)
        if attempt.trace is not None:
            # A failure policy's outcome (skipped, dead-lettered) ended the span already.
            attempt.trace.end("processed" if processed else "given_back")
        tp, record, hashed = attempt.item
        if processed:
            self._source.mark_processed(record)
        else:
            self._source.give_back(record)
        lane = attempt.lane
        lane.open -= 1
        self._budget.refund(tp, attempt.weight)
        key = (tp, hashed)
        if self.open.get(key) is attempt:
            del self.open[key]
            for waiting in self.waiting.pop(key, ()):
                self.schedule(waiting)
        lane.refused = False
        self._after_turn(lane)

    def forget(self, attempt: Attempt) -> None:
        self.attempts.discard(attempt)
        if not self.attempts:
            self.settled.set()

    def give_back(self, attempt: Attempt) -> None:
        if attempt.timer is not None:
            attempt.timer.cancel()
            attempt.timer = None
        self.settle(attempt, processed=False)


class WorkerRuntime(LifecycleHooks):
    """Processes one consumer's records with tasks (``task_factory``) or, in the handler
    form, with ``process`` on lanes of one key each. User code starts a record only when
    the source's ownership gate lets it (``calls``)."""

    def __init__(
        self,
        source: WorkerSource,
        config: WorkerConfig,
        calls: Calls,
        *,
        task_factory: Callable[[], WorkerTask] | None = None,
        handler_process: Process | None = None,
        partitioner: Partitioner | None = None,
        dead_letters: DeadLetters | None = None,
        tracer: RecordTracer | None = None,
    ) -> None:
        if (task_factory is None) == (handler_process is None):
            raise ValueError("give exactly one of task_factory and handler_process")
        form: Form
        if handler_process is not None:
            form = HandlerForm(handler_process)
        else:
            assert task_factory is not None
            partitioner = partitioner or KeyHashPartitioner(config.subpartitions)
            form = TaskForm(task_factory, partitioner, config, calls)
        self._form = form
        self._source = self.source = source
        self._config = config
        self._calls = calls
        self._lifecycle = Lifecycle(asyncio.get_running_loop())
        self._budget = ByteBudget(
            config.max_buffered_bytes, config.resume_ratio, source.pause, source.resume
        )
        self._intake = Intake(source, self._enqueue, self._budget)
        self.stats = Stats()
        self._scheduler = Scheduler(
            source, config, form, self._lifecycle, self._budget, self.stats, dead_letters, tracer
        )
        self._workers: set[asyncio.Task[None]] = set()
        # The one shutdown every ``stopping`` waits for.
        self._shutdown: asyncio.Future[None] | None = None

    # ----------------------------------------------------------------- the fetch side

    async def run(self) -> None:
        for index in range(self._config.max_concurrency):
            worker = asyncio.create_task(self._scheduler.work(), name=f"keyrange-worker-{index}")
            self._workers.add(worker)
        punctuator = asyncio.create_task(
            self._scheduler.tasks.punctuate_periodically(), name="keyrange-punctuate"
        )
        expiry = asyncio.create_task(
            self._scheduler.timeouts.expire_periodically(), name="keyrange-timeouts"
        )
        ended = self._lifecycle.ended
        try:
            await self._intake.run(ended)
        finally:
            await self.stopping(self._config.drain_timeout_s)
            for periodic in (punctuator, expiry):
                periodic.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await periodic
        if ended.done():
            ended.result()

    def _enqueue(self, item: Item) -> None:
        """Queue a record the intake took in (and charged) on its lane."""
        try:
            ident = self._form.lane_id(item)
        except WorkerFailed as error:
            self._lifecycle.fail(error)
            self._budget.refund(item[0], weight(item[1]))
            return
        lane = self._scheduler.lanes.get(ident) or self._scheduler.new_lane(ident)
        if lane is None:
            self._budget.refund(item[0], weight(item[1]))
            return
        lane.queue.append(item)
        lane.refused = False
        self._scheduler.schedule(lane)

    # ----------------------------------------------------------------- state

    @property
    def buffered_bytes(self) -> int:
        return self._budget.total

    @property
    def in_flight(self) -> int:
        return len(self._scheduler.attempts)

    @property
    def paused(self) -> frozenset[TopicPartition]:
        return self._budget.paused

    @property
    def pauses(self) -> int:
        """How many times a partition's fetching was paused."""
        return self._budget.pauses

    # ----------------------------------------------------------------- ownership changes

    def assigned(self, slices: Slices) -> None:
        """Create the tasks of owned partitions that have none now, so they punctuate before
        their first record arrives; the byte budget is shared by the owned partitions."""
        owned = self._owned_partitions()
        self._budget.set_partitions(len(owned))
        self._scheduler.tasks.open_partitions(sorted(owned))

    async def revoked(self, slices: Slices) -> None:
        """Close the tasks of partitions no slice of which is owned any more, now that their
        records in processing finished and were committed."""
        await self._close_unowned(slices)

    async def dropped(self, slices: Slices) -> None:
        """Lost partitions' tasks are closed as revoked ones are (their records' outcomes
        are not committed)."""
        await self._close_unowned(slices)

    async def _close_unowned(self, slices: Slices) -> None:
        owned = self._owned_partitions()
        self._budget.set_partitions(len(owned))
        await self._scheduler.tasks.close_partitions({tp for tp in slices if tp not in owned})

    def _owned_partitions(self) -> set[TopicPartition]:
        return {tp for tp, _, _ in self._source.slice_watermarks()}

    def revoking(self, slices: Slices | None) -> None:
        """Drop queued records of ``slices`` (all with None); attempts waiting to be tried
        again are given back, attempts in processing get until the drain's end and are
        not tried again."""
        scheduler = self._scheduler
        for lane in list(scheduler.lanes.values()):
            tp = lane.ident[0]
            if slices is not None and tp not in slices:
                continue
            kept: deque[Item] = deque()
            for item in lane.queue:
                if slices is None or in_slices(slices, *_key(item)):
                    self._budget.refund(item[0], weight(item[1]))
                else:
                    kept.append(item)
            lane.queue = kept
            lane.retries = deque(a for a in lane.retries if not _within(slices, a))
            if self._form.drops(lane) and not lane.scheduled:
                del scheduler.lanes[lane.ident]
        for attempt in list(scheduler.attempts):
            if not _within(slices, attempt):
                continue
            attempt.withdrawn = True
            if attempt.observer is None and not attempt.dead_lettering:
                scheduler.give_back(attempt)
        open_keys = scheduler.open
        for key in [key for key, attempt in open_keys.items() if attempt not in scheduler.attempts]:
            # Keys held by a record that stopped the worker: released with the slice.
            if slices is None or in_slices(slices, *key):
                del open_keys[key]

    def lost(self, slices: Slices) -> None:
        """The membership is lost: nothing queued is ours; calls on the loop are cancelled
        and calls in a process killed (their keys may be another member's already), calls
        waiting in a pool do not start (the gate ended with the membership), and thread
        calls run out with their outcome ignored."""
        self.revoking(None)
        self._stop_attempts(None)
        self._scheduler.waiting.clear()

    async def stop_calls(self, slices: Slices) -> None:
        """The revoke timeout passed with records of ``slices`` in processing: end the
        calls that can be ended and give their records back once they have; a thread call
        that has started runs on, its key held (the gate shows it), and its record goes
        back when it ends."""
        self._stop_attempts(slices)
        await self._calls.until_stopped()

    def _stop_attempts(self, slices: Slices | None) -> None:
        for attempt in list(self._scheduler.attempts):
            if not _within(slices, attempt) or attempt.dead_lettering:
                continue
            if attempt.calling:
                attempt.given_back_on_end = True
                if attempt.stop is not None:
                    attempt.stop()
                detach(attempt)
            else:
                detach(attempt)
                self._scheduler.give_back(attempt)

    # ----------------------------------------------------------------- shutdown

    async def stopping(self, timeout_s: float | None) -> None:
        """Stop taking records, give back what no task started, let records in processing
        (and dead letters on their way) end up to ``timeout_s``, close every task. Every
        caller waits for the one shutdown."""
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._shut_down(timeout_s))
        await asyncio.shield(self._shutdown)

    async def _shut_down(self, timeout_s: float | None) -> None:
        self._lifecycle.advance(Phase.STOPPING)
        self._lifecycle.end_fetch()
        self.revoking(None)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            await asyncio.wait_for(self._scheduler.settled.wait(), timeout_s)
        except TimeoutError:
            logger.warning(
                "records still in processing at shutdown; their calls are stopped where they "
                "can be, and they are delivered again",
                extra={"in_flight": len(self._scheduler.attempts)},
            )
            self._stop_attempts(None)
            await self._calls.until_stopped()
        await self._scheduler.tasks.close_all(deadline)
        self._lifecycle.advance(Phase.FINISHED)
        self._scheduler.stop_workers(len(self._workers))
        _, late = await asyncio.wait(self._workers, timeout=1.0) if self._workers else ((), ())
        for worker in late:
            worker.cancel()
        self._scheduler.failures.cancel()


def detach(attempt: Attempt) -> None:
    """The attempt's current call has no say any more: its observer's outcome is ignored."""
    if attempt.observer is not None:
        attempt.observer.resolved = True
        attempt.observer.attempt = None
        attempt.observer = None


def _key(item: Item) -> tuple[TopicPartition, int]:
    return item[0], item[2]


def _within(slices: Slices | None, attempt: Attempt) -> bool:
    return slices is None or in_slices(slices, *attempt.key)
