"""The worker runtime's lifecycle: one phase, read by every part of the runtime, and the one
signal that ends the fetch (a stop, or the failure that stops the worker)."""

from __future__ import annotations

import asyncio
from enum import IntEnum


class Phase(IntEnum):
    """Where the runtime is, in order: it only moves forward."""

    # Records are fetched and handed out.
    RUNNING = 0
    # The shutdown began: nothing new is handed out, nothing is tried again (a failure gives
    # its record back), records in processing end, tasks are closed.
    STOPPING = 1
    # Every task is closed: no lane takes a turn any more, the runtime's runners exit.
    FINISHED = 2


class Lifecycle:
    """The phase, and ``ended``: done once the fetch is to stop, with the failure that
    stopped the worker as its exception (the first one counts).

    ``stopping`` (the shutdown began or is over: nothing is handed out or tried again) and
    ``finished`` are read several times a record; they are set beside the phase, by
    ``advance`` only, because looking an enum member up costs ~80 ns on Python 3.11."""

    __slots__ = ("ended", "finished", "phase", "stopping")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ended: asyncio.Future[None] = loop.create_future()
        self.phase = Phase.RUNNING
        self.stopping = False
        self.finished = False

    def advance(self, phase: Phase) -> None:
        if phase <= self.phase:
            raise RuntimeError(
                f"the runtime's phase moves forward only, not {self.phase.name} -> {phase.name}"
            )
        self.phase = phase
        self.stopping = True
        self.finished = phase is Phase.FINISHED

    def end_fetch(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    def fail(self, error: Exception) -> None:
        if not self.ended.done():
            self.ended.set_exception(error)
