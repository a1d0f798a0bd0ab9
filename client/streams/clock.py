"""A task's inputs, stream time and the next-record choice (KIP-28's synchronization).

- partition time: the largest timestamp processed from that input;
- stream time: the largest partition time over the inputs (Kafka Streams since 2.1, KIP-353):
  an input gone quiet never holds windows open, lateness or stream-time punctuations back,
  as the smallest (KIP-28's first rule) did;
- next record: the buffered head with the lowest timestamp (ties: the input listed first);
- idle wait: while an input has nothing buffered, the task waits up to ``max_idle_ms`` for it
  before it processes what the others hold, so a join sees both sides in timestamp order.

Pausing an input that holds too much is the byte budget's (``client.runtime.budget``).

Pure: times are milliseconds handed in by the caller, records are opaque.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

NO_TIME = -1


class Buffered(NamedTuple):
    """A named tuple, made once per record: a frozen dataclass's ``__init__`` (an
    ``object.__setattr__`` per field) is several times slower to make."""

    timestamp: int
    record: Any


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing may be processed before ``until_ms`` (an empty input's idle wait)."""

    until_ms: int


class TaskInputs:
    """The buffered records of one task's inputs and the times derived from them."""

    def __init__(self, inputs: Sequence[Hashable], max_idle_ms: int = 0) -> None:
        if max_idle_ms < 0:
            raise ValueError("max_idle_ms must not be negative")
        self._order = list(inputs)
        # Most tasks read one input: its head is the next record, with no choice to make.
        self._one = len(self._order) == 1
        self._queues: dict[Hashable, deque[Buffered]] = {name: deque() for name in inputs}
        self._partition_time: dict[Hashable, int] = dict.fromkeys(inputs, NO_TIME)
        self._empty_since: dict[Hashable, int] = {}
        self._max_idle_ms = max_idle_ms
        self._stream_time = NO_TIME

    @property
    def stream_time(self) -> int:
        return self._stream_time

    def partition_time(self, name: Hashable) -> int:
        return self._partition_time[name]

    def buffered(self, name: Hashable | None = None) -> int:
        if name is not None:
            return len(self._queues[name])
        return sum(len(queue) for queue in self._queues.values())

    def add(self, name: Hashable, timestamp: int, record: Any) -> None:
        self._queues[name].append(Buffered(timestamp, record))
        self._empty_since.pop(name, None)

    def choose(self, now_ms: int) -> tuple[Hashable, Buffered] | Wait | None:
        """The next record to process and its input (taken off the buffer), a ``Wait``, or
        None when nothing is buffered."""
        if self._one:
            name = self._order[0]
            queue = self._queues[name]
            if not queue:
                return None
            head = queue.popleft()
            if head.timestamp > self._partition_time[name]:
                self._partition_time[name] = head.timestamp
                if head.timestamp > self._stream_time:
                    self._stream_time = head.timestamp
            return name, head
        heads = [(name, queue[0]) for name, queue in self._queues.items() if queue]
        if not heads:
            return None
        if len(heads) < len(self._queues) and self._max_idle_ms > 0:
            waiting_until = NO_TIME
            for name, queue in self._queues.items():
                if not queue:
                    since = self._empty_since.setdefault(name, now_ms)
                    waiting_until = max(waiting_until, since + self._max_idle_ms)
            if now_ms < waiting_until:
                return Wait(waiting_until)
        name, head = min(heads, key=lambda pair: (pair[1].timestamp, self._order.index(pair[0])))
        self._queues[name].popleft()
        self._advance(name, head.timestamp)
        return name, head

    def drop(self, keep: Any) -> list[Any]:
        """Remove buffered records for which ``keep(record)`` is false; returns them."""
        dropped: list[Any] = []
        for name, queue in self._queues.items():
            kept = deque(item for item in queue if keep(item.record))
            dropped.extend(item.record for item in queue if not keep(item.record))
            self._queues[name] = kept
        return dropped

    def _advance(self, name: Hashable, timestamp: int) -> None:
        if timestamp > self._partition_time[name]:
            self._partition_time[name] = timestamp
            if timestamp > self._stream_time:
                self._stream_time = timestamp
