"""Punctuation schedules (KIP-28): by stream time and by wall clock.

A schedule of interval ``i`` is due at the multiples of ``i``. Stream-time schedules fire when
the task's stream time reaches their due time, in due-time order across schedules (ties: the
one scheduled first), once per advance however many intervals it passed, with the stream time
as argument, as Kafka Streams does. Wall-clock schedules fire the same way on the wall clock.
Pure: the caller hands in the times.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from client.streams.processor import PunctuationType


@dataclass(eq=False)
class Schedule:
    interval_ms: int
    kind: PunctuationType
    callback: Callable[[int], None]
    sequence: int
    due_ms: int | None = None
    cancelled: bool = field(default=False)

    def cancel(self) -> None:
        self.cancelled = True


class Punctuations:
    """The schedules of one task."""

    def __init__(self) -> None:
        self._schedules: list[Schedule] = []
        self._sequence = itertools.count()

    def schedule(
        self, interval_ms: int, kind: PunctuationType, callback: Callable[[int], None]
    ) -> Schedule:
        if interval_ms < 1:
            raise ValueError("a punctuation interval is at least 1 ms")
        if not callable(callback):
            raise ValueError("a punctuation callback must be callable")
        entry = Schedule(interval_ms, kind, callback, next(self._sequence))
        self._schedules.append(entry)
        return entry

    def due(self, kind: PunctuationType, now_ms: int) -> list[tuple[Schedule, int]]:
        """The schedules of ``kind`` that fire at ``now_ms``, in firing order, each moved to
        its next due time. A schedule seen for the first time is aligned after ``now_ms``."""
        if not self._schedules:
            # Asked after every record: most tasks schedule nothing.
            return []
        self._schedules = [entry for entry in self._schedules if not entry.cancelled]
        firing = []
        for entry in self._schedules:
            if entry.kind is not kind or now_ms < 0:
                continue
            if entry.due_ms is None:
                entry.due_ms = _next_due(entry.interval_ms, now_ms)
                continue
            if now_ms >= entry.due_ms:
                firing.append((entry.due_ms, entry.sequence, entry))
        firing.sort(key=lambda item: (item[0], item[1]))
        result = []
        for _, _, entry in firing:
            entry.due_ms = _next_due(entry.interval_ms, now_ms)
            result.append((entry, now_ms))
        return result


def _next_due(interval_ms: int, now_ms: int) -> int:
    """The first multiple of ``interval_ms`` after ``now_ms``."""
    return (now_ms // interval_ms + 1) * interval_ms
