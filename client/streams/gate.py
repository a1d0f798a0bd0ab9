"""The ownership gate of the streams runtime (DESIGN §5, the client half): the one place that
says whether a task's record may start in user code now, and whether what a task produced may
be handed to the producer now.

A record starts only while the member's session deadline has not passed and its task is
neither halted (the membership was lost) nor closing (a revocation): a pool thread asks per
record, against the deadline read on the loop when its round began. Outputs are handed to
the producer only while the membership is live and the task not halted, asked right before
each hand-over, so a processor call that returns after the deadline (a loop blocked past the
session, a pool thread stuck in I/O) has its outputs dropped: the keys may be another
instance's by then, and a changelog write landing after the heir's would undo its counts.

What no client can prevent is a process frozen between this check and the socket, or the
producer delivering, after the deadline, records it was given before it: docs/streams.md
("Losing a range") and docs/guarantees.md call it the frozen-mid-call case.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from client.streams.task import StreamTask


class TaskGate:
    """Built on the consumer source's ``may_hand_out`` (asking it notices a passed deadline
    and halts every task) and ``session_deadline`` (an instant a pool thread can compare)."""

    def __init__(
        self, may_hand_out: Callable[[], bool], session_deadline: Callable[[], float]
    ) -> None:
        self._may_hand_out = may_hand_out
        self._session_deadline = session_deadline

    def round_deadline(self) -> float | None:
        """On the loop, as a round begins: the instant before which its records may start,
        or None when none may (the membership is lost, or its deadline just passed)."""
        if not self._may_hand_out():
            return None
        return self._session_deadline()

    @staticmethod
    def may_start(task: StreamTask, deadline: float) -> bool:
        """Whether ``task``'s next record (or punctuation) may start now; safe on a pool
        thread: it reads two flags the loop sets and the monotonic clock."""
        return not task.halted and not task.closing and time.monotonic() < deadline

    def may_send(self, task: StreamTask) -> bool:
        """On the loop, right before each record is handed to the producer: whether what
        ``task`` produced may still go out (DESIGN §5: nothing after a loss)."""
        return not task.halted and self._may_hand_out()
