"""Where user code runs: ``async def`` on the event loop, plain functions on a thread pool (a
plain handler on a process pool when ``processes`` is set), so the loop that fetches,
heartbeats and commits is never blocked by a handler."""

from __future__ import annotations

import asyncio
import inspect
import pickle
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from functools import partial
from typing import Any

from client.fetcher import Record
from client.worker.lanes import Observer
from client.worker.task import WorkerTask

Handler = Callable[[Record], Any]


def is_async(function: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(function)


def overrides(task: WorkerTask, method: str) -> bool:
    """Whether the task's class replaces ``WorkerTask``'s default of ``method``."""
    return getattr(type(task), method) is not getattr(WorkerTask, method)


class Calls:
    """The pools user code runs on; created on first use, shut down by ``close``."""

    def __init__(self, threads: int, processes: int) -> None:
        self._thread_count = threads
        self._process_count = processes
        self._threads: ThreadPoolExecutor | None = None
        self._processes: ProcessPoolExecutor | None = None

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)``: awaited on the loop when it is a coroutine function, else
        run on the thread pool."""
        if is_async(function):
            return await function(*args)
        return await self.in_thread(function, *args)

    async def in_thread(self, function: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread_pool(), partial(function, *args))

    def handler_process(
        self, handler: Handler
    ) -> Callable[[WorkerTask, Record, Observer], Awaitable[None]]:
        """The handler form's ``process``: success when the handler returns, failure when it
        raises, on the loop, the thread pool or the process pool as the handler needs."""
        run: Callable[[Record], Awaitable[Any]]
        if is_async(handler):
            run = handler
        elif self._process_count > 0:
            run = _Batches(handler, self._process_pool, self._process_count).run
        else:
            run = partial(self.in_thread, handler)

        async def process(_: WorkerTask, record: Record, observer: Observer) -> None:
            await run(record)
            observer.success()

        return process

    def close(self) -> None:
        """Stop the pools without waiting: a call still running in a thread cannot be
        interrupted, and its record was given back (it is not committed)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(wait=False, cancel_futures=True)

    def _thread_pool(self) -> Executor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self._thread_count, thread_name_prefix="keyrange-worker"
            )
        return self._threads

    def _process_pool(self) -> Executor:
        if self._processes is None:
            self._processes = ProcessPoolExecutor(self._process_count)
        return self._processes


class _Batches:
    """Sends records to the process pool a batch per process: one pickling round trip (some
    100 us of the parent's time) for many records instead of one each, which would cost as
    much as the millisecond handlers a process pool is for. Records handed out in the same
    turn of the event loop go together, split in two batches per process."""

    def __init__(self, handler: Handler, pool: Callable[[], Executor], processes: int) -> None:
        self._handler = handler
        self._pool = pool
        self._processes = processes
        self._pending: list[tuple[Record, asyncio.Future[None]]] = []

    async def run(self, record: Record) -> None:
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[None] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._send)
        self._pending.append((record, outcome))
        await outcome

    def _send(self) -> None:
        pending, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        # Two batches per process: each has the next one queued while it works, so it does
        # not wait for the loop to hand out more records.
        size = -(-len(pending) // (2 * self._processes))
        for start in range(0, len(pending), size):
            batch = pending[start : start + size]
            records = [record for record, _ in batch]
            sent = loop.run_in_executor(self._pool(), _run_batch, self._handler, records)
            sent.add_done_callback(partial(_settle_batch, [outcome for _, outcome in batch]))


def _run_batch(handler: Handler, records: list[Record]) -> list[BaseException | None]:
    """In the child process: each record's outcome, an exception that survives pickling."""
    outcomes: list[BaseException | None] = []
    for record in records:
        try:
            handler(record)
            outcomes.append(None)
        except Exception as error:
            try:
                pickle.dumps(error)
                outcomes.append(error)
            except Exception:
                outcomes.append(RuntimeError(f"{type(error).__qualname__}: {error}"))
    return outcomes


def _settle_batch(
    outcomes: list[asyncio.Future[None]], sent: asyncio.Future[list[BaseException | None]]
) -> None:
    errors: list[BaseException | None]
    if sent.cancelled():
        errors = [RuntimeError("the process pool was shut down")] * len(outcomes)
    elif sent.exception() is not None:
        # The pool broke (a child died): every record of the batch failed with it.
        errors = [sent.exception()] * len(outcomes)
    else:
        errors = sent.result()
    for outcome, error in zip(outcomes, errors, strict=True):
        if outcome.done():
            continue
        if error is None:
            outcome.set_result(None)
        else:
            outcome.set_exception(error)
