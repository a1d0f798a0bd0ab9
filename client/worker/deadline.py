"""The session deadline where user code starts (DESIGN §5, the client half). The engine asks
the hand-out guard before it hands a record to a pool, but the record can start in user code
much later: it waits for a thread when ``worker_threads`` is below ``max_concurrency``, and
sits in a child's pipe behind the batch the child works on. If the deadline passes meanwhile
(the loop blocked, the process frozen, heartbeats failing), the coordinator may give the key
to another member, so the pools check again right before each record starts.

Two things end a record's right to start: the session deadline of the membership it was
handed out under, and that membership ending (lost, fenced). A generation number tells
memberships apart: once the membership was lost and the member rejoined, the new
membership's deadline lies in the future again, and must not let a record of the old one
start."""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

Result = TypeVar("Result")


class NotStarted(Exception):
    """A pool did not start the record: when its turn came, the session deadline of the
    membership it was handed out under had passed, or that membership had ended. Not a
    failure of the handler: the failure policy never sees it; the record goes back to the
    slice's owner (or is sent again when the membership turns out to hold)."""


class SessionDeadline:
    """Which membership records are handed out under, and until when they may start: a
    generation that ``end`` moves on when the membership is lost, and the session deadline
    read from the consumer."""

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


class SharedDeadline:
    """A ``SessionDeadline`` as child processes see it: the generation and its deadline in
    shared memory, written by the parent's event loop, read by a child before each record.

    The children compare it with their own ``time.monotonic()``, which is CLOCK_MONOTONIC on
    Linux: one clock for every process of the machine (of one time namespace, which forked
    and spawned children share), so an instant means the same in parent and child. Measured
    under fork, spawn and forkserver: a child's reading lies between the parent's before and
    after starting it.

    No lock: the parent is the only writer, and each value is one aligned double. The parent
    writes the generation before its deadline and a child reads the deadline before the
    generation, so a deadline written for a later generation is read with that generation,
    never with the one before (stores are seen in order by other cores on x86; elsewhere the
    window is far shorter than the rejoin between the two writes)."""

    def __init__(self, context: BaseContext) -> None:
        self._values: Any = context.RawArray("d", [0.0, float("-inf")])

    def publish(self, generation: int, deadline: float) -> None:
        self._values[0] = float(generation)
        self._values[1] = deadline

    def permits(self, generation: int) -> bool:
        deadline: float = self._values[1]
        published: float = self._values[0]
        return published == generation and time.monotonic() < deadline
