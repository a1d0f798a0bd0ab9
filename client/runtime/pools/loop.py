"""The loop pool: user code on the event loop itself, in the task that asks. A coroutine call
is ended by cancelling that task, which the pool tells apart from a cancellation meant for
the task (a shutdown): its own comes back as ``Stopped``. A plain call on the loop (a streams
round) cannot be stopped, and the gate shows it running until it returns."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from client.runtime.gate import OwnershipGate, Running
from client.runtime.pools.pool import Claim, NotStarted, Stoppable, Stopped

Result = TypeVar("Result")
C = TypeVar("C", bound=Claim)


class LoopPool:
    def __init__(self, gate: OwnershipGate) -> None:
        self._gate = gate

    async def run(
        self,
        claim: Claim,
        slot: Stoppable | None,
        function: Callable[..., Awaitable[Result]],
        *args: Any,
    ) -> Result:
        running = claim.enter(self._gate)
        if running is None:
            raise NotStarted("the record's right to start ended before its turn came")
        task = asyncio.current_task()
        assert task is not None
        cancel = _Cancel(task)
        if slot is not None:
            slot.stop = cancel.stop
        try:
            result = await function(*args)
        except asyncio.CancelledError:
            # The pool's own cancellation is taken back; one meant for the task stays.
            if cancel.stopped and task.uncancel() == 0:
                raise Stopped("the call was cancelled to stop it") from None
            raise
        finally:
            if slot is not None:
                slot.stop = None
            self._gate.exit(running)
        # Stopped, but the call swallowed the cancellation and returned.
        if cancel.stopped and task.uncancel() > 0:
            raise asyncio.CancelledError
        return result

    def run_together(
        self, claims: Sequence[C], function: Callable[..., Result], *args: Any
    ) -> Result:
        """``function(entered, *args)`` on the loop, now, where ``entered`` are the claims
        the gate let in (in order), each registered until it returns: a round over several
        tasks that share one time budget."""
        entered: list[tuple[C, Running]] = []
        for claim in claims:
            running = claim.enter(self._gate)
            if running is not None:
                entered.append((claim, running))
        try:
            return function([claim for claim, _ in entered], *args)
        finally:
            for _, running in entered:
                self._gate.exit(running)

    async def until_stopped(self) -> None:
        """A cancelled call ends with its task's next step: nothing to wait for here."""

    def close(self) -> None:
        """Nothing is queued on the loop: what has not entered the gate never will."""


class _Cancel:
    """Cancels the task of a call once: a second stop must not cancel what follows it."""

    __slots__ = ("stopped", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.task.cancel()
