"""``run()``'s machinery: records of different keys processed concurrently, each key's one at a
time in offset order, on a fixed number of runners apart from the fetch.

It sees the consumer only through ``RecordSource`` (``client.runtime.seams``): the next record
to hand out, the hand-out guard (the membership's session deadline), handing out and marking.
Records come in through the kernel's intake (``client.runtime.intake``), like the other
runtimes'. It hears ownership changes through the lifecycle hooks (``client.runtime.hooks``),
registered by ``KeyrangeConsumer.run``: ``lost`` drops what is queued and cancels running
handlers. Handlers run on the kernel's loop pool (``client.runtime.pools.loop``), as the
worker's coroutine calls do: the gate is asked right before each starts, and a stopped one is
cancelled through the pool.

Its bound is a count, not the byte budget: at most 64 records per runner are queued and not
finished, and while that many are, the intake takes nothing more, so the fetcher's own buffer
holds the rest. A byte budget would pause partitions instead, at another point for every
record size, and ``RecordSource`` has no pause: ``run()`` keeps the bound it has always had.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.structs import TopicPartition

from client.fetcher import Item, Record, in_slices
from client.http import Slices
from client.runtime.gate import Lease
from client.runtime.hooks import LifecycleHooks
from client.runtime.intake import Intake
from client.runtime.pools.loop import LoopPool
from client.runtime.pools.pool import NotStarted, RecordClaim, Stopped
from client.runtime.seams import RecordSource
from client.tracing import RecordSpan, RecordTracer

Handler = Callable[[Record], Awaitable[object]]

# How long cancelled handlers get to end at shutdown before the consumer's stop takes over
# waiting for them (it holds their keys until they end).
_STOPPED_GRACE_S = 1.0


class Dispatcher(LifecycleHooks):
    """``run()``'s machinery: one chain of records per (partition, key hash) and a fixed pool
    of ``max_concurrency`` workers. A chain is scheduled at most once at any time, so a key's
    records run one at a time in offset order; a worker takes one record of a chain and puts
    the chain back at the end of the ready queue, so hot keys do not starve the others."""

    # Records dispatched but not finished, per worker: enough to keep every worker busy
    # across hot keys without reading the whole partition into memory.
    _QUEUED_PER_WORKER = 64

    def __init__(
        self,
        source: RecordSource,
        handler: Handler,
        max_concurrency: int,
        *,
        cancel_on_loss: bool,
        tracer: RecordTracer | None = None,
    ) -> None:
        self._source = source
        # Handlers are coroutines: they run on the kernel's loop pool, which asks the gate
        # right before each starts and ends one by cancelling it.
        self._pool = LoopPool(source.gate)
        self._tracer = tracer
        self._handler = handler
        self._workers = max_concurrency
        self._cancel_on_loss = cancel_on_loss
        self._max_queued = max_concurrency * self._QUEUED_PER_WORKER
        self._chains: dict[tuple[TopicPartition, int], deque[Item]] = {}
        self._ready: asyncio.Queue[tuple[TopicPartition, int] | None] = asyncio.Queue()
        # The worker task running each chain's head, and the chains whose handler was
        # cancelled because the membership was lost.
        self._running: dict[tuple[TopicPartition, int], tuple[asyncio.Task[Any], _Call]] = {}
        self._cancelled: set[tuple[TopicPartition, int]] = set()
        self._queued = 0
        self._space = asyncio.Event()
        self._space.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self) -> None:
        for index in range(self._workers):
            task = asyncio.create_task(self._work(), name=f"keyrange-worker-{index}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            # Ends when ``stopping`` or a handler's failure completes ``_failure``.
            await Intake(self._source, self._dispatch).run(self._failure)
        finally:
            await self.stopping(None)
        if self._failure.done():
            self._failure.result()

    def _dispatch(self, item: Item) -> Awaitable[None] | None:
        """Queue ``item`` on its key's chain; when the queue is full, what the intake waits
        for before it takes the next record."""
        tp, _, hashed = item
        ident = (tp, hashed)
        self._queued += 1
        chain = self._chains.get(ident)
        if chain is not None:
            chain.append(item)
        else:
            self._chains[ident] = deque([item])
            self._ready.put_nowait(ident)
        return self._room() if self._queued >= self._max_queued else None

    async def _room(self) -> None:
        """Until the queue has room again, or the run ends."""
        while self._queued >= self._max_queued and not self._failure.done():
            self._space.clear()
            space = asyncio.ensure_future(self._space.wait())
            waits: set[asyncio.Future[Any]] = {space, self._failure}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            space.cancel()

    async def _work(self) -> None:
        chains, ready, pool = self._chains, self._ready, self._pool
        worker = asyncio.current_task()
        assert worker is not None
        while True:
            ident = await ready.get()
            if ident is None or self._failure.done():
                return
            chain = chains[ident]
            # Asked before every hand-out. A lost membership dropped every queued record
            # before the answer turned False, so the chain is empty then.
            if not chain or not self._source.may_hand_out():
                self._done(len(chain))
                del chains[ident]
                continue
            tp, record, hashed = chain[0]
            call = _Call(self._source.hand_out(tp, record, hashed), tp, hashed, record.offset)
            self._running[ident] = (worker, call)
            span = (
                None
                if self._tracer is None
                else self._tracer.start(tp.topic, tp.partition, record, hashed)
            )
            token = None if span is None else span.current()
            started = True
            try:
                await pool.run(call, call, self._handler, record)
            except NotStarted:
                # Its slice is being revoked or the member stops: not ours to start.
                started = False
            except Stopped:
                pass  # stopped by ``_cancel``, which marked it: given back below
            except asyncio.CancelledError:
                if ident not in self._cancelled or worker.uncancel() > 0:
                    if span is not None:
                        span.end("given_back")
                    raise
            except Exception as error:
                if span is not None:
                    span.failed(error, "stopped", attempt=1)
                    span.end("failed")
                if not self._failure.done():
                    self._failure.set_exception(error)
                return
            finally:
                del self._running[ident]
                if token is not None:
                    RecordSpan.restore(token)
            chain.popleft()
            self._done(1)
            if not started:
                self._source.give_back(record)
                if span is not None:
                    span.end("given_back")
            elif ident in self._cancelled:
                # Cancelled (a lost membership, a revocation or a shutdown that timed out),
                # or it swallowed the cancellation: what it did is not trusted, and the key
                # may be another member's already, so the record is not marked.
                self._cancelled.discard(ident)
                if worker.cancelling():
                    worker.uncancel()
                self._source.give_back(record)
                if span is not None:
                    span.end("given_back")
            else:
                self._source.mark_processed(record)
                if span is not None:
                    span.end("processed")
            if chain:
                ready.put_nowait(ident)
            else:
                del chains[ident]

    def _done(self, count: int) -> None:
        self._queued -= count
        if self._queued < self._max_queued:
            self._space.set()

    def lost(self, slices: Slices) -> None:
        """The membership is lost: drop every queued record and cancel the handlers still
        running (unless ``cancel_on_loss`` is off), since their keys may be another member's
        already."""
        self.revoking(None)
        if self._cancel_on_loss:
            self._cancel(None)

    async def stop_calls(self, slices: Slices) -> None:
        """The revoke timeout passed with handlers of ``slices`` still running: cancel them
        (their records are not marked); one that ignores the cancellation holds its key."""
        self._cancel(slices)

    def _cancel(self, slices: Slices | None) -> None:
        current = asyncio.current_task()
        for ident, (worker, call) in self._running.items():
            if ident in self._cancelled or (slices is not None and not in_slices(slices, *ident)):
                continue
            self._cancelled.add(ident)
            # A handler that noticed the loss itself (``still_owned``) is told by the
            # answer; cancelling its own running task would strike after it returned.
            if worker is not current and call.stop is not None:
                call.stop()

    def revoking(self, slices: Slices | None) -> None:
        """Drop queued records of ``slices`` (all with None) that no handler started."""
        for (tp, hashed), chain in self._chains.items():
            if slices is not None and not in_slices(slices, tp, hashed):
                continue
            keep = 1 if (tp, hashed) in self._running else 0
            dropped = len(chain) - keep
            if dropped > 0:
                for _ in range(dropped):
                    chain.pop()
                self._done(dropped)

    async def stopping(self, timeout_s: float | None) -> None:
        """Stop dispatching; let started handlers end (up to ``timeout_s``), drop the rest."""
        self.revoking(None)
        if not self._failure.done():
            self._failure.set_result(None)
        for _ in range(self._workers):
            self._ready.put_nowait(None)
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            if late:
                # Through ``_cancel``, so a handler that swallows it is not marked either.
                self._cancel(None)
                for task in late:
                    task.cancel()
                # Those that ignore it keep running; the consumer's stop waits for them
                # through the gate, holding their keys.
                await asyncio.wait(late, timeout=_STOPPED_GRACE_S)


class _Call(RecordClaim):
    """One handler call: the loop pool's claim (its record's key under its slice's lease)
    and the slot where the pool leaves how to cancel it."""

    __slots__ = ("stop",)

    def __init__(self, lease: Lease | None, tp: TopicPartition, hashed: int, offset: int) -> None:
        super().__init__(lease, tp, hashed, offset)
        self.stop: Callable[[], None] | None = None
