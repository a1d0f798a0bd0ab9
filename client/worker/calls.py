"""Where user code runs: ``async def`` on the event loop, plain functions on a thread pool (a
plain handler on a process pool when ``processes`` is set), so the loop that fetches,
heartbeats and commits is never blocked by a handler. A record's call that waits in a pool
does not start once its session deadline passed (``client.worker.deadline``)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from typing import Any

from client.fetcher import Record
from client.worker.deadline import SessionDeadline
from client.worker.lanes import Observer
from client.worker.processes import Handler, ProcessPool
from client.worker.task import WorkerTask


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
        self._processes: ProcessPool | None = None

    async def call(
        self, function: Callable[..., Any], *args: Any, deadline: SessionDeadline | None = None
    ) -> Any:
        """``function(*args)``: awaited on the loop when it is a coroutine function, else
        run on the thread pool; for a record (``deadline`` given), not started in a thread
        past the deadline (``NotStarted``)."""
        if is_async(function):
            return await function(*args)
        return await self.in_thread(function, *args, deadline=deadline)

    async def in_thread(
        self, function: Callable[..., Any], *args: Any, deadline: SessionDeadline | None = None
    ) -> Any:
        loop = asyncio.get_running_loop()
        if deadline is None:
            call = partial(function, *args)
        else:
            # The generation is the hand-out's, taken now: the call may wait for a thread.
            call = partial(deadline.call, deadline.generation, function, *args)
        return await loop.run_in_executor(self._thread_pool(), call)

    def handler_process(
        self, handler: Handler, deadline: SessionDeadline
    ) -> Callable[[WorkerTask, Record, Observer], Awaitable[None]]:
        """The handler form's ``process``: success when the handler returns, failure when it
        raises, on the loop, the thread pool or the process pool as the handler needs;
        ``NotStarted`` when a pool did not start it before ``deadline``."""
        run: Callable[[Record], Awaitable[Any]]
        if is_async(handler):
            run = handler
        elif self._process_count > 0:
            run = self._process_pool(handler, deadline).run
        else:
            run = partial(self.in_thread, handler, deadline=deadline)

        async def process(_: WorkerTask, record: Record, observer: Observer) -> None:
            await run(record)
            observer.success()

        return process

    @property
    def process_wait_s(self) -> float:
        return 0.0 if self._processes is None else self._processes.waited_s

    def close(self) -> None:
        """Stop the pools without waiting: a call still running in a thread cannot be
        interrupted, and its record was given back (it is not committed)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.close()

    def _thread_pool(self) -> Executor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self._thread_count, thread_name_prefix="keyrange-worker"
            )
        return self._threads

    def _process_pool(self, handler: Handler, deadline: SessionDeadline) -> ProcessPool:
        if self._processes is None:
            self._processes = ProcessPool(handler, self._process_count, deadline)
        return self._processes
