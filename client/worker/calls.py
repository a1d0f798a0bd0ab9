"""Where user code runs: ``async def`` on the event loop, plain functions on a thread pool (a
plain handler on a process pool when ``processes`` is set), so the loop that fetches,
heartbeats and commits is never blocked by a handler. Every call of user code on a record
asks the ownership gate right before it starts (``client.runtime.gate``), and leaves in the
record's attempt a way to end it: cancelling the loop call, cancelling a thread call that has
not started, killing the process (``client.worker.processes``). A thread call that has
started cannot be ended; the gate shows it running until it returns."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from client.runtime.gate import OwnershipGate
from client.worker.deadline import NotStarted, call_through
from client.worker.lanes import Attempt, Observer
from client.worker.processes import Handler, ProcessPool
from client.worker.task import WorkerTask


def is_async(function: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(function)


def overrides(task: WorkerTask, method: str) -> bool:
    """Whether the task's class replaces ``WorkerTask``'s default of ``method``."""
    return getattr(type(task), method) is not getattr(WorkerTask, method)


class Calls:
    """The pools user code runs on; created on first use, shut down by ``close``."""

    def __init__(self, threads: int, processes: int, gate: OwnershipGate) -> None:
        self._thread_count = threads
        self._process_count = processes
        self._gate = gate
        self._threads: ThreadPoolExecutor | None = None
        self._processes: ProcessPool | None = None

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` for the runtime itself (a task's ``punctuate`` or ``close``):
        awaited on the loop when it is a coroutine function, else run on the thread pool."""
        if is_async(function):
            return await function(*args)
        return await asyncio.get_running_loop().run_in_executor(
            self._thread_pool(), partial(function, *args)
        )

    async def for_record(self, attempt: Attempt, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on ``attempt``'s record: started only if the gate lets it
        (``NotStarted`` else), stoppable through ``attempt.stop`` while it runs."""
        tp, record, hashed = attempt.item
        if is_async(function):
            running = self._gate.enter(attempt.lease, tp, hashed, record.offset)
            if running is None:
                raise NotStarted("the record's right to start ended before its turn came")
            task = asyncio.current_task()
            assert task is not None
            attempt.stop = partial(_interrupt, attempt, task)
            try:
                return await function(*args)
            finally:
                attempt.stop = None
                self._gate.exit(running)
        call = partial(
            call_through, self._gate, attempt.lease, tp, hashed, record.offset, function, *args
        )
        future: Future[Any] = self._thread_pool().submit(call)
        attempt.stop = partial(_cancel_unstarted, future)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancelled() and not _cancelling():
                raise NotStarted("stopped before a thread took it") from None
            raise
        finally:
            attempt.stop = None

    def handler_process(
        self, handler: Handler
    ) -> Callable[[WorkerTask, Attempt, Observer], Awaitable[None]]:
        """The handler form's ``process``: success when the handler returns, failure when it
        raises, on the loop, the thread pool or the process pool as the handler needs;
        ``NotStarted`` when the gate did not let it start."""
        if is_async(handler) or self._process_count == 0:

            async def process(_: WorkerTask, attempt: Attempt, observer: Observer) -> None:
                await self.for_record(attempt, handler, attempt.item[1])
                observer.success()

            return process
        pool = self._process_pool(handler)

        async def in_process(_: WorkerTask, attempt: Attempt, observer: Observer) -> None:
            await pool.run(attempt.item[1], attempt.lease, attempt)
            observer.success()

        return in_process

    async def until_stopped(self) -> None:
        """Until processes killed to stop their calls have exited."""
        if self._processes is not None:
            await self._processes.until_stopped()

    @property
    def process_wait_s(self) -> float:
        return 0.0 if self._processes is None else self._processes.waited_s

    def close(self) -> None:
        """Stop the pools without waiting: a call still running in a thread cannot be
        interrupted (the consumer's stop waited for it), and what never started was given
        back (it is not committed)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.close()

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self._thread_count, thread_name_prefix="keyrange-worker"
            )
        return self._threads

    def _process_pool(self, handler: Handler) -> ProcessPool:
        if self._processes is None:
            self._processes = ProcessPool(handler, self._process_count, self._gate)
        return self._processes


def _interrupt(attempt: Attempt, task: asyncio.Task[Any]) -> None:
    if not attempt.interrupted:
        attempt.interrupted = True
        task.cancel()


def _cancel_unstarted(future: Future[Any]) -> None:
    """A thread call is stopped only while it waits for a thread; once running it is not."""
    future.cancel()


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
