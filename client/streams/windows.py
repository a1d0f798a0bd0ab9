"""Windows by event time: tumbling, hopping and session windows, with grace periods.

A time window ``[start, end)`` closes once the task's stream time reaches ``end + grace``: a
record for it after that is late and dropped, and a final result is emitted then. A session
of one key extends while its records come less than ``gap`` apart; it closes once stream
time passes ``end + gap + grace`` (no in-order record can extend it any more), and a record
is late when the session it would make, merged with those it falls within ``gap`` of, ends
before ``stream time - grace`` (Kafka Streams' rule). Pure: the window store and the DSL's windowed
aggregations use these rules.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from client.streams.serde import Serde

_TIMES = struct.Struct(">qq")


def _check(what: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer of at least {minimum}, not {value!r}")


@dataclass(frozen=True)
class TimeWindows:
    """Fixed-size windows every ``advance_ms``: tumbling when the advance is the size."""

    size_ms: int
    advance_ms: int
    grace_ms: int = 0
    retention_ms: int | None = None

    def __post_init__(self) -> None:
        _check("size_ms", self.size_ms, 1)
        _check("advance_ms", self.advance_ms, 1)
        _check("grace_ms", self.grace_ms, 0)
        if self.advance_ms > self.size_ms:
            raise ValueError("advance_ms larger than size_ms would leave gaps between windows")
        # The store expires by the latest window end written, up to a size ahead of stream
        # time: a retention below size + grace drops windows still open (Kafka Streams
        # refuses it with the same rule).
        if self.retention_ms is not None and self.retention_ms < self.size_ms + self.grace_ms:
            raise ValueError(
                f"retention_ms ({self.retention_ms}) must be no smaller than the window size "
                f"plus the grace period (size_ms {self.size_ms} + grace_ms {self.grace_ms} = "
                f"{self.size_ms + self.grace_ms}): a shorter one drops windows still open"
            )

    @property
    def kind(self) -> str:
        return "tumbling" if self.advance_ms == self.size_ms else "hopping"

    def windows_for(self, timestamp: int) -> list[tuple[int, int]]:
        """Every window holding ``timestamp``, oldest first."""
        advance = self.advance_ms
        # Windows start at multiples of the advance: the first holding the timestamp starts
        # after ``timestamp - size``, none before 0.
        first = max(0, -(-(timestamp - self.size_ms + 1) // advance))
        return [
            (index * advance, index * advance + self.size_ms)
            for index in range(first, timestamp // advance + 1)
        ]

    def closed(self, end: int, stream_time: int) -> bool:
        return end + self.grace_ms <= stream_time

    def store_retention_ms(self) -> int:
        """How long after its end the store keeps a window (at least size + grace)."""
        return self.retention_ms if self.retention_ms is not None else self.grace_ms + self.size_ms


def tumbling(size_ms: int, grace_ms: int = 0, retention_ms: int | None = None) -> TimeWindows:
    return TimeWindows(size_ms, size_ms, grace_ms, retention_ms)


def hopping(
    size_ms: int, advance_ms: int, grace_ms: int = 0, retention_ms: int | None = None
) -> TimeWindows:
    return TimeWindows(size_ms, advance_ms, grace_ms, retention_ms)


@dataclass(frozen=True)
class SessionWindows:
    """Per-key sessions of activity: records less than ``gap_ms`` apart share one."""

    gap_ms: int
    grace_ms: int = 0
    retention_ms: int | None = None

    def __post_init__(self) -> None:
        _check("gap_ms", self.gap_ms, 1)
        _check("grace_ms", self.grace_ms, 0)
        if self.retention_ms is not None and self.retention_ms < self.gap_ms + self.grace_ms:
            raise ValueError(
                f"retention_ms ({self.retention_ms}) must be no smaller than the inactivity gap "
                f"plus the grace period (gap_ms {self.gap_ms} + grace_ms {self.grace_ms} = "
                f"{self.gap_ms + self.grace_ms}): a shorter one drops sessions still open"
            )

    kind = "session"

    def late(self, merged_end: int, stream_time: int) -> bool:
        """Whether a record is late, by the end of the session it merges into."""
        return merged_end + self.grace_ms < stream_time

    def closed(self, end: int, stream_time: int) -> bool:
        return end + self.gap_ms + self.grace_ms < stream_time

    def store_retention_ms(self) -> int:
        if self.retention_ms is not None:
            return self.retention_ms
        return self.gap_ms + self.grace_ms + self.gap_ms


def session(gap_ms: int, grace_ms: int = 0, retention_ms: int | None = None) -> SessionWindows:
    return SessionWindows(gap_ms, grace_ms, retention_ms)


Windows = TimeWindows | SessionWindows


@dataclass(frozen=True, slots=True)
class Windowed:
    """A windowed aggregation's key: the record key and its window ``[start, end)``."""

    key: Any
    start: int
    end: int


class WindowedSerde:
    """A ``Windowed`` key as the inner key's bytes then start and end (8 bytes each, big
    endian), like Kafka Streams' time-windowed serde; a sink of a windowed table uses it."""

    def __init__(self, inner: Serde) -> None:
        self.inner = inner

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        key = self.inner.serialize(value.key) or b""
        return key + _TIMES.pack(value.start, value.end)

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        start, end = _TIMES.unpack(data[-_TIMES.size :])
        return Windowed(self.inner.deserialize(data[: -_TIMES.size]), start, end)
