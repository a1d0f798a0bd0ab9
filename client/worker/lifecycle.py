"""The worker engine's lifecycle: one phase, read by every part of the engine, and the one
signal that ends the fetch (a stop, or the failure that stops the worker)."""

from __future__ import annotations

import asyncio
from enum import Enum


class Phase(Enum):
    """Where the engine is; it only moves forward."""

    # Records are fetched and handed out.
    RUNNING = "running"
    # The shutdown began: nothing new is handed out, nothing is tried again (a failure gives
    # its record back), records in processing end, tasks are closed.
    STOPPING = "stopping"
    # Every task is closed: no lane takes a turn any more, the engine's workers exit.
    FINISHED = "finished"


class Lifecycle:
    """The phase, and ``ended``: done once the fetch is to stop, with the failure that
    stopped the worker as its exception (the first one counts)."""

    __slots__ = ("ended", "phase")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.phase = Phase.RUNNING
        self.ended: asyncio.Future[None] = loop.create_future()

    @property
    def stopping(self) -> bool:
        """The shutdown began (or is over): records are not handed out or tried again."""
        return self.phase is not Phase.RUNNING

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    def end_fetch(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    def fail(self, error: Exception) -> None:
        if not self.ended.done():
            self.ended.set_exception(error)
