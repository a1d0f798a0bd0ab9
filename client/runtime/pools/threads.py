"""The thread pool: plain functions off the event loop, so the loop that fetches, heartbeats
and commits is never blocked by user code. A call asks the gate on the pool thread that is
about to run it, since it may have waited there long after it was handed out. A call still
waiting for a thread can be stopped (it never starts); a call that has started cannot be, and
the gate shows it running until it returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from client.runtime.gate import OwnershipGate
from client.runtime.pools.pool import Claim, NotStarted, Stoppable

Result = TypeVar("Result")


class ThreadPool:
    """``threads`` threads, started on first use, named ``name``."""

    def __init__(self, threads: int, gate: OwnershipGate, name: str) -> None:
        self._count = threads
        self._gate = gate
        self._name = name
        self._threads: ThreadPoolExecutor | None = None

    async def run(
        self,
        claim: Claim,
        slot: Stoppable | None,
        function: Callable[..., Result],
        *args: Any,
    ) -> Result:
        future: Future[Result] = self._pool().submit(
            partial(call_through, self._gate, claim, function, *args)
        )
        if slot is not None:
            slot.stop = partial(_cancel_unstarted, future)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancelled() and not _cancelling():
                raise NotStarted("stopped before a thread took it") from None
            raise
        finally:
            if slot is not None:
                slot.stop = None

    async def call(self, function: Callable[..., Result], *args: Any) -> Result:
        """``function(*args)`` on a thread, for a runtime's own call into user code that
        is on no record (a task's ``punctuate`` or ``close``): the gate is not asked."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool(), partial(function, *args)
        )

    async def until_stopped(self) -> None:
        """A started thread call cannot be stopped; an unstarted one is cancelled at once."""

    def close(self, *, wait: bool = False) -> None:
        """Start nothing more; what waits for a thread is cancelled. With ``wait``, until
        the calls running on threads have returned (a thread cannot be interrupted)."""
        if self._threads is not None:
            self._threads.shutdown(wait=wait, cancel_futures=True)

    def _pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self._count, thread_name_prefix=self._name)
        return self._threads


def call_through(
    gate: OwnershipGate, claim: Claim, function: Callable[..., Result], *args: Any
) -> Result:
    """``function(*args)`` on a pool thread, if the gate lets ``claim`` start now
    (``NotStarted`` else); the gate knows the call runs until it returns."""
    running = claim.enter(gate)
    if running is None:
        raise NotStarted("the record's right to start ended before its turn came")
    try:
        return function(*args)
    finally:
        gate.exit(running)


def _cancel_unstarted(future: Future[Any]) -> None:
    """A thread call is stopped only while it waits for a thread; once running it is not."""
    future.cancel()


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
