"""The session deadline where user code starts (DESIGN §5, the client half). The engine asks
the hand-out guard before it hands a record to a pool, but the record can start in user code
much later: it waits for a thread when ``worker_threads`` is below ``max_concurrency``. If the
deadline passes meanwhile (the loop blocked, the process frozen, heartbeats failing), the
coordinator may give the key to another member, so a pool thread checks again right before
the record starts.

Two things end a record's right to start: the session deadline of the membership it was
handed out under, and that membership ending (lost, fenced). A generation number tells
memberships apart: once the membership was lost and the member rejoined, the new
membership's deadline lies in the future again, and must not let a record of the old one
start."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

Result = TypeVar("Result")


class NotStarted(Exception):
    """A pool did not start the record: when its turn came, the session deadline of the
    membership it was handed out under had passed, or that membership had ended. Not a
    failure of the handler: the failure policy never sees it; the record goes back to the
    slice's owner (or is sent again when the membership turns out to hold)."""


class SessionDeadline:
    """The membership records are handed out under: its generation, which ``end`` moves on
    when the membership is lost, and its session deadline, read from the consumer."""

    def __init__(self, session_deadline: Callable[[], float]) -> None:
        # The monotonic instant from which nothing may be handed out (-inf once the loss is
        # known, +inf while not a member); reads attributes only, so a thread may call it.
        self._session_deadline = session_deadline
        self.generation = 0
        self._on_end: list[Callable[[], None]] = []

    def deadline(self) -> float:
        return self._session_deadline()

    def permits(self, generation: int) -> bool:
        """Whether a record handed out under ``generation`` may start now; for a pool
        thread. The deadline is read before the generation: a deadline read after ``end``
        (a rejoined membership's, in the future again) then meets the moved generation."""
        deadline = self._session_deadline()
        return generation == self.generation and time.monotonic() < deadline

    def call(self, generation: int, function: Callable[..., Result], *args: Any) -> Result:
        """``function(*args)`` unless the record's right to start ended (``NotStarted``)."""
        if not self.permits(generation):
            raise NotStarted("the session deadline passed before the record's turn came")
        return function(*args)

    def end(self) -> None:
        """The membership was lost: no record handed out so far may start any more."""
        self.generation += 1
        for listener in self._on_end:
            listener()

    def on_end(self, listener: Callable[[], None]) -> None:
        self._on_end.append(listener)
