"""The worker runtime's engine: records routed to sub-partition lanes, lanes served by a fixed
pool of ``max_concurrency`` workers apart from the fetch, acknowledgements turned into marks
(the consumer's tracker then commits watermarks and IC ranges), failures into the policy's
next step, and buffered bytes into pause and resume of the partitions' fetching.

Ordering rules, enforced here and nowhere else:

* a lane hands its records to its task in offset order, one call at a time;
* a record is not handed out while an earlier record of its key (partition, key hash) has no
  outcome yet: it may be in processing, waiting for its acknowledgement, waiting to be tried
  again or on its way to the dead-letter topic;
* a lane waits behind its head; other lanes (and, in the handler form, where every key is
  its own lane, other keys) keep flowing.

Lanes take turns through one ready queue, each at most once in it, so a lane with many
records does not starve the others (the backlog-driven scheduling of the Kafka Streams
threading design, with a turn of one call).

The module is a little over the 600-line guideline on purpose: its parts (lanes, calls, the
failure policy, the byte budget, processing deadlines, the session deadline the pools check,
dead letters) are modules of their own, and what
stays is the one state the ordering rules above govern; split further, the rules would be
enforced in two places.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.structs import TopicPartition

from client.errors import ConsumerStopped
from client.fetcher import FetchInterrupted, Item, in_slices
from client.http import Slices
from client.runtime.seams import WorkerSource
from client.worker.calls import Calls, is_async, overrides
from client.worker.config import WorkerConfig
from client.worker.deadletter import DeadLetters
from client.worker.deadline import NotStarted
from client.worker.failures import (
    Backoff,
    FailureHistory,
    Next,
    ProcessingTimeout,
    WorkerFailed,
    next_step,
)
from client.worker.lanes import Attempt, KeyId, Lane, LaneId, Observer, weight
from client.worker.pressure import ByteBudget
from client.worker.task import KeyHashPartitioner, Partitioner, SubPartition, WorkerTask

logger = logging.getLogger(__name__)

Process = Callable[[WorkerTask, Attempt, Observer], Awaitable[None]]


class Stats:
    """Running totals for metrics and tests."""

    __slots__ = ("dead_lettered", "failed", "processed", "retried", "skipped")

    def __init__(self) -> None:
        self.processed = 0
        self.failed = 0
        self.retried = 0
        self.dead_lettered = 0
        self.skipped = 0


class WorkerEngine:
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
        handler_on_loop: bool = True,
        partitioner: Partitioner | None = None,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        if (task_factory is None) == (handler_process is None):
            raise ValueError("give exactly one of task_factory and handler_process")
        self._source = self.source = source
        self._config = config
        self._calls = calls
        self._task_factory = task_factory
        self._partitioner = partitioner or KeyHashPartitioner(config.subpartitions)
        self._dead_letters = dead_letters
        self._backoff = Backoff(config.retry_backoff_s, config.retry_backoff_max_s)
        self._rng = random.Random()
        self._loop = asyncio.get_running_loop()
        # The handler form: one shared stateless "task" whose process calls the handler.
        self._shared = None if handler_process is None else WorkerTask()
        self._process: Process = handler_process or self._task_process
        self._lanes: dict[LaneId, Lane] = {}
        self._open: dict[KeyId, Attempt] = {}
        self._waiting: dict[KeyId, list[Lane]] = {}
        self._attempts: set[Attempt] = set()
        self._ready: asyncio.Queue[Lane | None] = asyncio.Queue()
        self._workers: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._budget = ByteBudget(
            config.max_buffered_bytes, config.resume_ratio, source.pause, source.resume
        )
        self._timeout = config.processing_timeout_s
        # (deadline, the attempt's observer), in deadline order.
        self._deadlines: deque[tuple[float, Observer]] = deque()
        self._handler_on_loop = handler_on_loop
        self._stop: asyncio.Future[None] = self._loop.create_future()
        self._settled = asyncio.Event()
        self._settled.set()
        self._stopping = False
        self._finishing: asyncio.Future[None] | None = None
        self._finished = False
        self.stats = Stats()

    # ----------------------------------------------------------------- the fetch side

    async def run(self) -> None:
        for index in range(self._config.max_concurrency):
            worker = asyncio.create_task(self._work(), name=f"keyrange-worker-{index}")
            self._workers.add(worker)
        punctuator = asyncio.create_task(self._punctuate_periodically(), name="keyrange-punctuate")
        expiry = asyncio.create_task(self._expire_periodically(), name="keyrange-timeouts")
        try:
            while not self._stop.done():
                try:
                    # Not kept in a local: the last record would live on while fetching waits.
                    self._enqueue(await self._source.next_item(self._stop))
                except FetchInterrupted:
                    break
                except ConsumerStopped:
                    if self._source.stopped:
                        break
                    raise
        finally:
            await self.finish(self._config.drain_timeout_s)
            for periodic in (punctuator, expiry):
                periodic.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await periodic
        if self._stop.done():
            self._stop.result()

    def _enqueue(self, item: Item) -> None:
        tp, record, hashed = item
        if self._shared is not None:
            ident: LaneId = (tp, hashed)
        else:
            index = self._partitioner.subpartition(record, hashed)
            count = self._partitioner.count(tp)
            if not 0 <= index < count:
                self._fail(WorkerFailed(f"the partitioner gave sub-partition {index} of {count}"))
                return
            ident = (tp, index)
        lane = self._lanes.get(ident) or self._new_lane(ident)
        if lane is None:
            return
        lane.queue.append(item)
        self._budget.add(tp, weight(record))
        lane.refused = False
        self._schedule(lane)

    def _new_lane(self, ident: LaneId) -> Lane | None:
        if self._shared is not None:
            lane = self._lanes[ident] = Lane(ident, self._shared)
            return lane
        assert self._task_factory is not None
        tp, index = ident
        try:
            task = self._task_factory()
            task.init(
                SubPartition(tp.topic, tp.partition, index, self._partitioner.count(tp)),
                self._config,
            )
        except Exception as error:
            logger.exception("task init failed", extra={"topic": tp.topic, "index": index})
            self._fail(WorkerFailed(f"task init failed: {error!r}"))
            return None
        lane = self._lanes[ident] = Lane(ident, task)
        return lane

    # ----------------------------------------------------------------- scheduling

    def _schedule(self, lane: Lane) -> None:
        if lane.busy or lane.scheduled or self._finished:
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
        if not lane.queue or lane.refused or self._stopping:
            return
        tp, _, hashed = lane.queue[0]
        key = (tp, hashed)
        if key in self._open:
            waiting = self._waiting.setdefault(key, [])
            if lane not in waiting:
                waiting.append(lane)
            return
        lane.scheduled = True
        self._ready.put_nowait(lane)

    async def _work(self) -> None:
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
            if lane.closed is None and self._shared is not None and lane.idle:
                # The handler form's lanes are keys: gone once nothing of theirs is left.
                self._lanes.pop(lane.ident, None)
            else:
                self._schedule(lane)

    async def _serve(self, lane: Lane) -> None:
        """One turn of a lane: close its task, punctuate, try a record again, or hand out
        the next record."""
        if lane.closed is not None:
            await self._close_task(lane)
            return
        if lane.punctuate_due:
            lane.punctuate_due = False
            lane.refused = False
            await self._task_call(lane, "punctuate", time.time())
            return
        if lane.retries:
            # Asked before a retry too: a lost session gives the record back instead.
            if self._source.may_hand_out():
                await self._attempt(lane.retries.popleft())
            return
        if not lane.queue or self._stopping:
            return
        item = lane.queue[0]
        tp, record, hashed = item
        if (tp, hashed) in self._open:
            return
        if self._shared is None and overrides(lane.task, "accept"):
            try:
                accepted = lane.task.accept(record)
            except Exception as error:
                self._fail(WorkerFailed(f"task accept failed: {error!r}"))
                return
            if not accepted:
                lane.refused = True
                return
        if not self._source.may_hand_out():
            return  # the membership is lost; ``lose`` withdraws what is queued
        lane.queue.popleft()
        lease = self._source.hand_out(tp, record, hashed)
        attempt = Attempt(item, lane, weight(record), lease)
        self._open[(tp, hashed)] = attempt
        self._attempts.add(attempt)
        self._settled.clear()
        lane.open += 1
        await self._attempt(attempt)

    async def _attempt(self, attempt: Attempt) -> None:
        """One call of ``process``, awaited in this worker, so no other record of the lane
        (of the key, in the handler form) starts before it has ended. A call that has not
        started, or runs on the loop or in a process, is ended when its record times out or
        its slice must go (``Attempt.stop``); a call running on a thread cannot be, and the
        record's outcome waits for it."""
        attempt.number += 1
        observer = Observer(attempt, self._resolve, self._loop)
        attempt.observer = observer
        self._deadlines.append((self._loop.time() + self._timeout, observer))
        attempt.calling = True
        try:
            await self._process(attempt.lane.task, attempt, observer)
        except asyncio.CancelledError:
            if not attempt.interrupted:
                raise
        except NotStarted:
            if attempt.observer is observer and attempt.overdue is None:
                self._not_started(attempt)
        except Exception as error:
            observer.failure(error)
        finally:
            attempt.calling = False
            attempt.stop = None
            if attempt.interrupted:
                attempt.interrupted = False
                worker = asyncio.current_task()
                if worker is not None and worker.uncancel() > 0:
                    raise asyncio.CancelledError
        self._call_ended(attempt, observer)

    def _call_ended(self, attempt: Attempt, observer: Observer) -> None:
        """What waited for the call to end: a timeout's outcome, or giving the record back
        after its slice was lost or revoked past the timeout."""
        if attempt.overdue is not None:
            overdue, attempt.overdue = attempt.overdue, None
            if attempt.observer is observer:
                self._resolve(observer, overdue)
                return
        if attempt.given_back_on_end:
            attempt.given_back_on_end = False
            self._give_back(attempt)

    def _not_started(self, attempt: Attempt) -> None:
        """A pool did not start the record: its right to start had ended when its turn came,
        or its call was stopped first. No call of ``process`` happened, so nothing counts it
        as a failure, retries or dead-letters it. Asking the hand-out guard notices a loss
        the pool saw, and the loss gives the record back with everything else; a record
        whose slice is still ours (a heartbeat answered after the deadline the pool read,
        a revocation of another slice) is sent again, first in its lane."""
        attempt.number -= 1
        _detach(attempt)
        if not self._source.may_hand_out():
            return
        if attempt.withdrawn or self._stopping or attempt.lease is None or not attempt.lease.valid:
            self._give_back(attempt)
        else:
            attempt.lane.retries.appendleft(attempt)

    def _on_loop(self, lane: Lane) -> bool:
        if self._shared is not None:
            return self._handler_on_loop
        return is_async(lane.task.process)

    async def _expire_periodically(self) -> None:
        """Processing timeouts without a timer per record: every attempt has the same
        timeout, so deadlines come in the order attempts started. An entry outlives its
        attempt's outcome until its deadline, holding only the detached observer."""
        deadlines = self._deadlines
        while True:
            now = self._loop.time()
            while deadlines and deadlines[0][0] <= now:
                _, observer = deadlines.popleft()
                if not observer.resolved:
                    self._timed_out(observer)
            await asyncio.sleep(deadlines[0][0] - now if deadlines else self._timeout)

    async def _task_process(self, task: WorkerTask, attempt: Attempt, observer: Observer) -> None:
        await self._calls.for_record(attempt, task.process, attempt.item[1], observer)

    async def _task_call(self, lane: Lane, method: str, *args: Any) -> None:
        if self._shared is not None or not overrides(lane.task, method):
            return
        try:
            await self._calls.call(getattr(lane.task, method), *args)
        except Exception:
            tp, index = lane.ident
            logger.exception(
                f"task {method} failed",
                extra={"topic": tp.topic, "partition": tp.partition, "index": index},
            )

    async def _punctuate_periodically(self) -> None:
        interval = self._config.punctuate_interval_s
        while True:
            await asyncio.sleep(interval)
            if self._shared is not None:
                return
            for lane in list(self._lanes.values()):
                if overrides(lane.task, "punctuate") and lane.closed is None:
                    lane.punctuate_due = True
                    self._schedule(lane)

    # ----------------------------------------------------------------- outcomes

    def _timed_out(self, observer: Observer) -> None:
        error = ProcessingTimeout(
            f"no acknowledgement within {self._config.processing_timeout_s} s"
        )
        attempt = observer.attempt
        if attempt is None or not attempt.calling or attempt.observer is not observer:
            self._resolve(observer, error)
            return
        # Its call is still under way: stopped where it can be; the outcome waits for it to
        # end, so no retry (and no next record of the key) overlaps it.
        attempt.overdue = error
        if attempt.stop is not None:
            attempt.stop()
        tp, record, hashed = attempt.item
        logger.warning(
            "processing timeout; the record's outcome waits for its call to end",
            extra={
                "topic": tp.topic,
                "partition": tp.partition,
                "offset": record.offset,
                "key_hash": hashed,
                "timeout_s": self._config.processing_timeout_s,
            },
        )

    def _resolve(self, observer: Observer, error: BaseException | None) -> None:
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
            self.stats.processed += 1
            self._settle(attempt, processed=True)
        else:
            self._failed(attempt, error)

    def _failed(self, attempt: Attempt, error: BaseException) -> None:
        tp, record, _ = attempt.item
        now_ms = int(time.time() * 1000)
        attempt.first_failure_ms = attempt.first_failure_ms or now_ms
        attempt.last_failure_ms = now_ms
        self.stats.failed += 1
        where = {
            "topic": tp.topic,
            "partition": tp.partition,
            "offset": record.offset,
            "attempt": attempt.number,
            "error_type": type(error).__name__,
            "error": str(error),
        }
        step = next_step(
            self._config.failure_policy,
            attempt.number,
            self._config.max_attempts,
            still_ours=not (attempt.withdrawn or self._stopping),
        )
        if step is Next.GIVE_BACK:
            self._settle(attempt, processed=False)
        elif step is Next.SKIP:
            logger.warning("record failed; skipped", extra=where)
            self.stats.skipped += 1
            self._settle(attempt, processed=True)
        elif step is Next.RETRY:
            delay = self._backoff.delay(attempt.number, self._rng)
            logger.warning("record failed; trying again", extra={**where, "delay_s": delay})
            self.stats.retried += 1
            attempt.timer = self._loop.call_later(delay, self._retry_due, attempt)
        elif step is Next.DEAD_LETTER:
            attempt.dead_lettering = True
            self._spawn(self._dead_letter(attempt, error))
        else:
            logger.error("record failed; stopping (failure policy at_least_once)", extra=where)
            # The key stays open: no later record of it runs, so none is committed past it.
            self._forget(attempt)
            self._source.give_back(record)
            self._fail(
                WorkerFailed(f"{tp.topic}[{tp.partition}] offset {record.offset} failed: {error!r}")
            )

    def _retry_due(self, attempt: Attempt) -> None:
        attempt.timer = None
        attempt.lane.retries.append(attempt)
        self._schedule(attempt.lane)

    async def _dead_letter(self, attempt: Attempt, error: BaseException) -> None:
        _, record, hashed = attempt.item
        history = FailureHistory(
            attempt.number, error, attempt.first_failure_ms, attempt.last_failure_ms
        )
        if not self._source.may_hand_out():
            return  # the session was lost (which gave the record back): no side effect
        try:
            if self._dead_letters is None:
                raise WorkerFailed("no dead-letter topic is configured")
            await self._dead_letters.send(record, hashed, history)
        except Exception as send_error:
            logger.error(
                "dead letter not acknowledged; stopping",
                extra={"offset": record.offset, "error": repr(send_error)},
            )
            self._forget(attempt)
            self._source.give_back(record)
            self._fail(WorkerFailed(f"dead letter of offset {record.offset} failed: {send_error}"))
            return
        self.stats.dead_lettered += 1
        self._settle(attempt, processed=True)

    def _settle(self, attempt: Attempt, *, processed: bool) -> None:
        """The attempt's record has its outcome: mark it (or give it back), open its key."""
        if attempt not in self._attempts:
            return
        self._forget(attempt)
        tp, record, hashed = attempt.item
        if processed:
            self._source.mark_processed(record)
        else:
            self._source.give_back(record)
        lane = attempt.lane
        lane.open -= 1
        self._budget.release(tp, attempt.weight)
        key = (tp, hashed)
        if self._open.get(key) is attempt:
            del self._open[key]
            for waiting in self._waiting.pop(key, ()):
                self._schedule(waiting)
        lane.refused = False
        if lane.idle and lane.closed is None and self._shared is not None:
            self._lanes.pop(lane.ident, None)
        else:
            self._schedule(lane)

    def _forget(self, attempt: Attempt) -> None:
        self._attempts.discard(attempt)
        if not self._attempts:
            self._settled.set()

    def _fail(self, error: Exception) -> None:
        if not self._stop.done():
            self._stop.set_exception(error)

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ----------------------------------------------------------------- state

    def set_owned_partitions(self, count: int) -> None:
        self._budget.set_partitions(count)

    @property
    def buffered_bytes(self) -> int:
        return self._budget.total

    @property
    def in_flight(self) -> int:
        return len(self._attempts)

    @property
    def paused(self) -> frozenset[TopicPartition]:
        return self._budget.paused

    @property
    def pauses(self) -> int:
        """How many times a partition's fetching was paused."""
        return self._budget.pauses

    # ----------------------------------------------------------------- ownership changes

    def open_partitions(self, partitions: list[TopicPartition]) -> None:
        """Create the tasks of newly owned partitions now, so they punctuate before their
        first record arrives."""
        if self._shared is not None or self._stopping:
            return
        for tp in partitions:
            for index in range(self._partitioner.count(tp)):
                if (tp, index) not in self._lanes:
                    self._new_lane((tp, index))

    def withdraw(self, slices: Slices | None) -> None:
        """Drop queued records of ``slices`` (all with None); attempts waiting to be tried
        again are given back, attempts in processing get until the drain's end and are
        not tried again."""
        for lane in list(self._lanes.values()):
            tp = lane.ident[0]
            if slices is not None and tp not in slices:
                continue
            kept: deque[Item] = deque()
            for item in lane.queue:
                if slices is None or in_slices(slices, *_key(item)):
                    self._budget.release(item[0], weight(item[1]))
                else:
                    kept.append(item)
            lane.queue = kept
            lane.retries = deque(a for a in lane.retries if not _within(slices, a))
            if self._shared is not None and lane.idle and not lane.scheduled:
                del self._lanes[lane.ident]
        for attempt in list(self._attempts):
            if not _within(slices, attempt):
                continue
            attempt.withdrawn = True
            if attempt.observer is None and not attempt.dead_lettering:
                self._give_back(attempt)
        for key in [key for key, attempt in self._open.items() if attempt not in self._attempts]:
            # Keys held by a record that stopped the worker: released with the slice.
            if slices is None or in_slices(slices, *key):
                del self._open[key]

    def lose(self) -> None:
        """The membership is lost: nothing queued is ours; calls on the loop are cancelled
        and calls in a process killed (their keys may be another member's already), calls
        waiting in a pool do not start (the gate ended with the membership), and thread
        calls run out with their outcome ignored."""
        self.withdraw(None)
        self._stop_attempts(None)
        self._waiting.clear()

    async def stop_calls(self, slices: Slices) -> None:
        """The revoke timeout passed with records of ``slices`` in processing: end the
        calls that can be ended and give their records back once they have; a thread call
        that has started runs on, its key held (the gate shows it), and its record goes
        back when it ends."""
        self._stop_attempts(slices)
        await self._calls.until_stopped()

    def _stop_attempts(self, slices: Slices | None) -> None:
        for attempt in list(self._attempts):
            if not _within(slices, attempt) or attempt.dead_lettering:
                continue
            if attempt.calling:
                attempt.given_back_on_end = True
                if attempt.stop is not None:
                    attempt.stop()
                _detach(attempt)
            else:
                _detach(attempt)
                self._give_back(attempt)

    def _give_back(self, attempt: Attempt) -> None:
        if attempt.timer is not None:
            attempt.timer.cancel()
            attempt.timer = None
        self._settle(attempt, processed=False)

    async def close_partitions(self, partitions: set[TopicPartition]) -> None:
        """Close the tasks of partitions this member no longer owns any slice of, each after
        its current call, within the drain timeout."""
        if self._stopping:
            return  # the shutdown closes every task
        lanes = [lane for lane in self._lanes.values() if lane.ident[0] in partitions]
        await self._close_lanes(lanes)

    async def _close_lanes(self, lanes: list[Lane]) -> None:
        waits: list[asyncio.Future[None]] = []
        for lane in lanes:
            if lane.closed is None:
                lane.closed = self._loop.create_future()
                self._schedule(lane)
            waits.append(lane.closed)
        if waits:
            _, late = await asyncio.wait(waits, timeout=self._config.drain_timeout_s)
            for lane in lanes:
                if lane.closed in late:
                    # Its task is still in a call: the lane stays (a re-acquired partition's
                    # records wait in it) until the call ends and the task is closed, so one
                    # sub-partition never has two tasks running at once.
                    logger.warning("task not closed in time", extra={"lane": str(lane.ident)})

    async def _close_task(self, lane: Lane) -> None:
        await self._task_call(lane, "close")
        assert lane.closed is not None
        if not lane.closed.done():
            lane.closed.set_result(None)
        if self._lanes.get(lane.ident) is lane:
            del self._lanes[lane.ident]
            if lane.queue and not self._stopping:
                # The partition was granted again while the task closed: a new task takes
                # the records that waited.
                heir = self._new_lane(lane.ident)
                if heir is not None:
                    heir.queue = lane.queue
                    self._schedule(heir)

    async def finish(self, timeout_s: float | None) -> None:
        """Stop taking records, give back what no task started, let records in processing
        (and dead letters on their way) end up to ``timeout_s``, close every task. Every
        caller waits for the one shutdown."""
        if self._finishing is None:
            self._finishing = asyncio.ensure_future(self._finish(timeout_s))
        await asyncio.shield(self._finishing)

    async def _finish(self, timeout_s: float | None) -> None:
        self._stopping = True
        if not self._stop.done():
            self._stop.set_result(None)
        self.withdraw(None)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            await asyncio.wait_for(self._settled.wait(), timeout_s)
        except TimeoutError:
            logger.warning(
                "records still in processing at shutdown; their calls are stopped where they "
                "can be, and they are delivered again",
                extra={"in_flight": len(self._attempts)},
            )
            self._stop_attempts(None)
            await self._calls.until_stopped()
        if self._shared is None:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 1.0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._close_lanes(list(self._lanes.values()))
        self._finished = True
        for _ in self._workers:
            self._ready.put_nowait(None)
        _, late = await asyncio.wait(self._workers, timeout=1.0) if self._workers else ((), ())
        for worker in late:
            worker.cancel()
        for task in self._background:
            task.cancel()


def _detach(attempt: Attempt) -> None:
    """The attempt's current call has no say any more: its observer's outcome is ignored."""
    if attempt.observer is not None:
        attempt.observer.resolved = True
        attempt.observer.attempt = None
        attempt.observer = None


def _key(item: Item) -> tuple[TopicPartition, int]:
    return item[0], item[2]


def _within(slices: Slices | None, attempt: Attempt) -> bool:
    return slices is None or in_slices(slices, *attempt.key)
