"""Where the worker runs user code, on the kernel's pools (``client.runtime.pools``):
``async def`` on the loop pool, plain functions on the thread pool (a plain handler on the
process pool when ``processes`` is set), so the loop that fetches, heartbeats and commits is
never blocked by a handler. An attempt is the pools' claim (its record's key under its
slice's lease, asked of the gate right before the call starts) and the slot where a pool
leaves the way to end its call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from client.fetcher import Record
from client.runtime.gate import OwnershipGate
from client.runtime.pools.loop import LoopPool
from client.runtime.pools.pool import Pool, is_async
from client.runtime.pools.processes import ProcessPool
from client.runtime.pools.threads import ThreadPool
from client.worker.lanes import Attempt, Observer
from client.worker.task import WorkerTask

Handler = Callable[[Record], Any]


def overrides(task: WorkerTask, method: str) -> bool:
    """Whether the task's class replaces ``WorkerTask``'s default of ``method``."""
    return getattr(type(task), method) is not getattr(WorkerTask, method)


class Calls:
    """The pools user code runs on; the thread and process pools start on first use, and
    ``close`` shuts them down."""

    def __init__(self, threads: int, processes: int, gate: OwnershipGate) -> None:
        self._process_count = processes
        self._gate = gate
        self._loop = LoopPool(gate)
        self._threads = ThreadPool(threads, gate, "keyrange-worker")
        self._processes: ProcessPool | None = None

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` for the runtime itself (a task's ``punctuate`` or ``close``):
        awaited on the loop when it is a coroutine function, else run on the thread pool."""
        if is_async(function):
            return await function(*args)
        return await self._threads.call(function, *args)

    def for_record(
        self, attempt: Attempt, function: Callable[..., Any], *args: Any
    ) -> Awaitable[Any]:
        """``function(*args)`` on ``attempt``'s record, to await: started only if the gate
        lets it (``NotStarted`` else), stoppable through ``attempt.stop`` while it runs
        (``Stopped`` when a loop call was). The pool's own coroutine, so a record's call
        costs no frame of its own here."""
        if is_async(function):
            if attempt.trace is not None:
                function = attempt.trace.around_async(function)
            return self._loop.run(attempt, attempt, function, *args)
        if attempt.trace is not None:
            function = attempt.trace.around(function)
        return self._threads.run(attempt, attempt, function, *args)

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
        pool: Pool = self._process_pool()

        async def in_process(_: WorkerTask, attempt: Attempt, observer: Observer) -> None:
            await pool.run(attempt, attempt, handler, attempt.item[1])
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
        self._threads.close()
        if self._processes is not None:
            self._processes.close()

    def _process_pool(self) -> ProcessPool:
        if self._processes is None:
            self._processes = ProcessPool(self._process_count, self._gate)
        return self._processes
