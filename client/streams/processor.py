"""What user code implements and sees (KIP-28): ``Processor`` and ``ProcessorContext``.

Pure: the context is an interface here; ``client.streams.task`` implements it per task.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class PunctuationType(enum.Enum):
    """KIP-28's two clocks: the task's stream time (record timestamps) or the wall clock."""

    STREAM_TIME = "stream-time"
    WALL_CLOCK = "wall-clock"


STREAM_TIME = PunctuationType.STREAM_TIME
WALL_CLOCK = PunctuationType.WALL_CLOCK

Punctuator = Callable[[int], None]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class KeyValueStore(Protocol):
    """A task's view of a key-value store; keys and values go through the store's serdes.
    Range scans run in the order of the serialized keys' bytes, bounds inclusive."""

    @property
    def name(self) -> str: ...

    def get(self, key: Any) -> Any: ...

    def put(self, key: Any, value: Any) -> None: ...

    def delete(self, key: Any) -> None: ...

    def range(self, low: Any, high: Any) -> list[tuple[Any, Any]]: ...

    def all(self) -> list[tuple[Any, Any]]: ...


class WindowStore(Protocol):
    """A task's view of a window store (``client.streams.window_store``): values per key and
    window ``[start, end)``, times in milliseconds, scans by key and by time."""

    @property
    def name(self) -> str: ...

    def put(self, key: Any, start: int, end: int, value: Any, *, final: bool = False) -> None: ...

    def get(self, key: Any, start: int | None = None, end: int | None = None) -> Any: ...

    def entry(self, key: Any, start: int, end: int) -> tuple[Any, bool] | None: ...

    def is_final(self, key: Any, start: int, end: int) -> bool: ...

    def fetch(self, key: Any, time_from: int = ..., time_to: int = ...) -> list[Any]: ...

    def fetch_range(
        self, key_from: Any, key_to: Any, time_from: int = ..., time_to: int = ...
    ) -> list[Any]: ...

    def fetch_all(self, time_from: int = ..., time_to: int = ...) -> list[Any]: ...

    def sessions(self, key: Any, earliest_end: int, latest_start: int) -> list[Any]: ...

    def ended(self, end_from: int, end_to: int) -> list[Any]: ...


class ProcessorContext(Protocol):
    """A processor's handle on its task: the current record's metadata, forwarding, schedules,
    stores and commit requests."""

    @property
    def application_id(self) -> str: ...

    @property
    def task_id(self) -> str: ...

    @property
    def topic(self) -> str | None: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]:
        """The headers the record reaching this processor carries: the input record's, or
        those an upstream ``forward(..., headers=...)`` put in their place; empty in a
        punctuation. ``forward`` passes them on unless given others."""
        ...

    @property
    def stream_time(self) -> int: ...

    def forward(
        self,
        key: Any,
        value: Any,
        to: str | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> None: ...

    def schedule(
        self, interval_ms: int, kind: PunctuationType, callback: Punctuator
    ) -> Cancellable: ...

    def commit(self) -> None: ...

    def state_store(self, name: str) -> KeyValueStore: ...

    def forward_on_flush(self, name: str) -> bool:
        """Hand the forwarding of key-value store ``name``'s changes to its record cache
        (``cache_max_bytes``, docs/streams.md): each key's latest value is forwarded from this
        processor as it leaves the cache (at the task's commit, or evicted when the cache is
        full), as Kafka Streams' DSL tables and aggregations do, and the processor forwards
        none itself. False, and nothing changes, when the store is not cached: the processor
        forwards each change itself. Called from ``init``."""
        ...

    def window_store(self, name: str) -> WindowStore: ...

    def after_outputs_acknowledged(self, action: Callable[[], None]) -> None:
        """Run ``action`` at the task's next commit, once Kafka has acknowledged everything
        the task produced before this call, and before the task's inputs are marked. What
        ``action`` writes to stores goes to their changelogs within that commit: a record
        that must never reach a changelog ahead of the output it stands for (``final()``'s
        mark of a window emitted) is written here. Never run when the task is dropped first
        (a lost membership, a failed send): its inputs go to the keys' next owner."""
        ...


class Processor:
    """One node of a topology. ``init`` runs once per task before its first record (the
    context stays valid for the task's life), ``process`` once per record that reaches the
    node, ``close`` when the task ends (its keys moved away, or the application stops)."""

    context: ProcessorContext

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        return None
