"""Window stores: windows of each key by time, in segments by window end, expired by stream
time, in memory or RocksDB (one database per segment, so expiry drops whole files).

Inside a segment an entry's key is the record key's bytes, then the window's start and end
(8 bytes each, big endian): a key's windows are adjacent and ordered by start, and a range
scan by key and time is one scan per segment. A segment holds the windows ending in its
``segment_ms`` of time; once the latest window end written is more than the retention past
a segment's last end, the segment goes (looked at whenever a write starts a new segment).
The engine is shared by this process's tasks on the
partition (each a key range): the latest end that counts is that of the task furthest
behind, so a lagging task never loses a window it has yet to close, and a task that joins
(after a hand-off, restoring) holds expiry back from before its restore: no write is dropped
for being below the floor.

The changelog is keyed by the record key alone, the window and a flag going into the value
(``encode_change``): the restore's key-range filter (and its C judge) read the key as they do
for a key-value store, and a task's range restores exactly its keys' windows. Towards
``StateManager`` and the restorer the backend is a ``BytesStore`` of changelog records:
``apply`` replays them, ``scan`` lists every entry in that form and ``delete`` removes every
window of a key, which is all ``delete_ranges`` needs.
"""

from __future__ import annotations

import shutil
import struct
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from client.protocol.keyspace import KeyRange, in_ranges, key_hash
from client.streams.cache import MISSING, WINDOW_SUFFIX, CacheBudget, Entries, WindowCache
from client.streams.errors import StoreKeyOutsideTask, StreamsError
from client.streams.stores import BytesStore, ChangelogWrite, MemoryStore, RocksStore
from client.streams.topology import StoreSpec

_TIMES = struct.Struct(">qq")
assert _TIMES.size == WINDOW_SUFFIX
_CHANGE = struct.Struct(">Bqq")
_TIME_MAX = 2**63 - 1
_MIN_SEGMENT_MS = 60_000
DELETED = 1
# A window whose final result was emitted: a record arriving for it later (a replay after a
# hand-off, whose stream time starts over) is late, so a final result is never revised.
FINAL = 2


def encode_change(start: int, end: int, flags: int, value: bytes) -> bytes:
    return _CHANGE.pack(flags, start, end) + value


def decode_change(data: bytes) -> tuple[int, int, int, bytes]:
    flags, start, end = _CHANGE.unpack_from(data)
    return start, end, flags, data[_CHANGE.size :]


def segment_interval(spec: StoreSpec) -> int:
    retention = spec.retention_ms or 0
    return spec.segment_ms or max(retention // 2, _MIN_SEGMENT_MS)


class WindowBackend:
    """The segments of one (window store, partition); see the module docstring."""

    def __init__(
        self,
        retention_ms: int,
        segment_ms: int,
        open_segment: Callable[[int], BytesStore],
        drop_segment: Callable[[int], None],
        existing: Iterable[int] = (),
    ) -> None:
        self._retention_ms = retention_ms
        self._segment_ms = segment_ms
        self._open_segment = open_segment
        self._drop_segment = drop_segment
        self._segments: dict[int, BytesStore] = {index: open_segment(index) for index in existing}
        # The latest window end written, through any view or by a restore.
        self.observed = -1
        # The live tasks' views: the engine is shared by this process's tasks on the
        # partition, and expiry follows the one furthest behind, never dropping a window a
        # lagging task has yet to close (its final result included).
        self._views: weakref.WeakSet[TaskWindowStore] = weakref.WeakSet()
        # The standby ranges tailed into this engine, each with the latest window end tailed:
        # their owners are other instances, each at its own stream time, and expiry waits
        # for the one furthest behind as it does for a lagging task.
        self._tails: dict[KeyRange, int] = {}
        # The highest segment written, and the lowest one not expired.
        self._top = max(self._segments, default=-1)
        self._floor = -1
        # Tasks of the partition run on pool threads (``processing_threads``) and queries on
        # the loop: a segment dropped by one task's write must not be scanned, written or
        # closed under another's. Held per write and per segment scanned, never across a
        # yield; uncontended it costs a put 0.1-0.2 us (of 1-2 us on the test machine).
        self._lock = threading.Lock()

    def register(self, view: TaskWindowStore) -> None:
        """A task's view joins before its restore: its clock (nothing written yet) holds
        expiry back, and the floor comes down to it, so the restore's windows and the
        task's replay go in even where a faster range's writes had dropped the segment."""
        with self._lock:
            self._views.add(view)
            self._floor = min(self._floor, self._floor_at(self._stream_time()))

    def segment_of(self, end: int) -> int:
        return end // self._segment_ms

    def expired(self, end: int) -> bool:
        """Whether a window ending at ``end`` is in a segment already dropped (a cached write
        of it is hidden, as its segment's windows are)."""
        return end // self._segment_ms < self._floor

    def tail(self, keys: KeyRange) -> BytesStore:
        """Where a standby of ``keys`` writes what it tails: the engine, with the range's
        own clock kept (until ``untail``) so that no other range's progress expires it."""
        with self._lock:
            self._tails.setdefault(keys, -1)
            self._floor = min(self._floor, self._floor_at(self._stream_time()))
        return _Tail(self, keys)

    def tailed(self, keys: KeyRange, end: int) -> None:
        """The standby of ``keys`` tailed a window ending at ``end`` (before writing it: the
        range's own write never expires what it still needs)."""
        with self._lock:
            if end > self._tails.get(keys, end):
                self._tails[keys] = end

    def untail(self, keys: KeyRange) -> None:
        """The standby of ``keys`` stopped (dropped, or an active task's now)."""
        with self._lock:
            self._tails.pop(keys, None)

    def _stream_time(self) -> int:
        clocks = [view.observed for view in self._views]
        clocks.extend(self._tails.values())
        return min(clocks) if clocks else self.observed

    # ---------------------------------------------------------------- windows

    def put_window(self, key: bytes, start: int, end: int, flags: int, value: bytes) -> None:
        index = end // self._segment_ms
        entry = key + _TIMES.pack(start, end)
        with self._lock:
            if end > self.observed:
                self.observed = end
            # A write below the floor is kept (its segment opened again): only a range still
            # behind writes there, and the next expiry looks at it by that range's clock.
            if index > self._top:
                # Stream time moves on by segments: expiry is looked at when one starts.
                self._top = index
                self._expire()
            segment = self._segments.get(index)
            if segment is None:
                segment = self._segments[index] = self._open_segment(index)
            if flags & DELETED:
                segment.delete(entry)
            else:
                segment.put(entry, bytes([flags]) + value)

    def get_window(self, key: bytes, start: int, end: int) -> tuple[int, bytes] | None:
        with self._lock:
            segment = self._segments.get(end // self._segment_ms)
            raw = None if segment is None else segment.get(key + _TIMES.pack(start, end))
        return None if raw is None else (raw[0], raw[1:])

    def windows(
        self,
        low_key: bytes | None,
        high_key: bytes | None,
        start_from: int = 0,
        start_to: int = _TIME_MAX,
        end_from: int = 0,
        end_to: int = _TIME_MAX,
    ) -> Iterator[tuple[bytes, int, int, int, bytes]]:
        """(key, start, end, flags, value) with the key in ``[low_key, high_key]`` (None: no
        bound), start and end in their bounds; by segment, then key, then start."""
        with self._lock:
            indexes = sorted(self._segments)
        low = None if low_key is None else low_key + _TIMES.pack(0, 0)
        high = None if high_key is None else high_key + _TIMES.pack(_TIME_MAX, _TIME_MAX)
        for index in indexes:
            if (index + 1) * self._segment_ms <= end_from or index * self._segment_ms > end_to:
                continue
            with self._lock:
                # Dropped since the listing: its windows expired, none to list.
                segment = self._segments.get(index)
                rows = [] if segment is None else list(segment.scan(low, high))
            for entry, raw in rows:
                key = entry[: -_TIMES.size]
                if (low_key is not None and key < low_key) or (
                    high_key is not None and key > high_key
                ):
                    continue
                start, end = _TIMES.unpack(entry[-_TIMES.size :])
                if start_from <= start <= start_to and end_from <= end <= end_to:
                    yield key, start, end, raw[0], raw[1:]

    # ---------------------------------------------------------------- BytesStore

    def get(self, key: bytes) -> bytes | None:
        return None

    def put(self, key: bytes, value: bytes) -> None:
        start, end, flags, payload = decode_change(value)
        self.put_window(key, start, end, flags, payload)

    def delete(self, key: bytes) -> None:
        with self._lock:
            for segment in self._segments.values():
                doomed = [
                    entry
                    for entry, _ in segment.scan(
                        key + _TIMES.pack(0, 0), key + _TIMES.pack(_TIME_MAX, _TIME_MAX)
                    )
                    if entry[: -_TIMES.size] == key
                ]
                segment.apply((entry, None) for entry in doomed)

    def apply(self, changes: Iterable[tuple[bytes, bytes | None]]) -> None:
        for key, value in changes:
            if value is None:
                self.delete(key)
            else:
                self.put(key, value)

    def scan(
        self, low: bytes | None = None, high: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        for key, start, end, flags, value in self.windows(low, high):
            yield key, encode_change(start, end, flags, value)

    def flush(self) -> None:
        with self._lock:
            for segment in self._segments.values():
                segment.flush()

    def close(self) -> None:
        with self._lock:
            for segment in self._segments.values():
                segment.close()
            self._segments.clear()

    def _floor_at(self, stream_time: int) -> int:
        return (stream_time - self._retention_ms) // self._segment_ms

    def _expire(self) -> None:
        """Drop the segments whose every window ended more than the retention before the
        clock of the task or standby range furthest behind."""
        self._floor = self._floor_at(self._stream_time())
        for index in [index for index in self._segments if index < self._floor]:
            self._segments.pop(index).close()
            self._drop_segment(index)


class _Tail:
    """A standby range's writes into a ``WindowBackend`` (see ``WindowBackend.tail``)."""

    def __init__(self, backend: WindowBackend, keys: KeyRange) -> None:
        self._backend = backend
        self._keys = keys

    def get(self, key: bytes) -> bytes | None:
        return None

    def put(self, key: bytes, value: bytes) -> None:
        self.apply([(key, value)])

    def delete(self, key: bytes) -> None:
        self._backend.delete(key)

    def apply(self, changes: Iterable[tuple[bytes, bytes | None]]) -> None:
        backend = self._backend
        for key, value in changes:
            if value is None:
                backend.delete(key)
                continue
            start, end, flags, payload = decode_change(value)
            backend.tailed(self._keys, end)
            backend.put_window(key, start, end, flags, payload)

    def scan(
        self, low: bytes | None = None, high: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self._backend.scan(low, high)

    def flush(self) -> None:
        self._backend.flush()

    def close(self) -> None:
        return None


def open_window_backend(spec: StoreSpec, directory: Path | None) -> WindowBackend:
    retention = spec.retention_ms or 0
    interval = segment_interval(spec)
    if not spec.persistent:
        return WindowBackend(retention, interval, lambda _: MemoryStore(), lambda _: None)
    if directory is None:
        raise StreamsError(f"store '{spec.name}' is persistent and no state directory is set")
    root = directory / "segments"

    def drop(index: int) -> None:
        shutil.rmtree(root / str(index), ignore_errors=True)

    existing = (
        [int(path.name) for path in root.iterdir() if path.name.isdigit()] if root.exists() else []
    )
    return WindowBackend(
        retention, interval, lambda index: RocksStore(root / str(index)), drop, existing
    )


class TaskWindowStore:
    """A task's typed view of a window store: serdes, the key-range check, the changelog, and
    the record cache (``client.streams.cache``) when the process has one: a window's writes
    then wait in it, the last per window, until the task's commit flushes them or the budget
    evicts them. Times are milliseconds; a window is ``[start, end)``."""

    def __init__(
        self,
        spec: StoreSpec,
        backend: WindowBackend,
        ranges: Sequence[KeyRange],
        changelog: ChangelogWrite,
        cache: CacheBudget | None = None,
    ) -> None:
        self._spec = spec
        self._backend = backend
        self._ranges = list(ranges)
        self._changelog = changelog
        self.cache = None if cache is None else WindowCache(cache, self._write_out)
        # The latest window end this task wrote: its share of the engine's stream time.
        self.observed = -1
        backend.register(self)

    @property
    def name(self) -> str:
        return self._spec.name

    def put(self, key: Any, start: int, end: int, value: Any, *, final: bool = False) -> None:
        """Store ``value`` for ``key``'s window (None deletes it); ``final`` marks its final
        result emitted."""
        raw_key = self._key(key, check=True)
        if value is None:
            flags, raw = DELETED, b""
        else:
            flags = FINAL if final else 0
            serialized = self._spec.value_serde.serialize(value)
            if serialized is None:
                raise StreamsError(f"store '{self.name}': the value serde gave no bytes")
            raw = serialized
        self.observed = max(self.observed, end)
        if self.cache is not None:
            entry = raw_key + _TIMES.pack(start, end)
            if not final:
                self.cache.put(entry, bytes([flags]) + raw)
                return
            # A final mark goes past the cache, with the result it marks: one write per
            # window, and a crash before the next commit repeats the result only when the
            # mark had not reached the changelog (docs/guarantees.md), not whenever it waited
            # in the cache.
            self.cache.take(entry)
        self._backend.put_window(raw_key, start, end, flags, raw)
        self._changelog(raw_key, encode_change(start, end, flags, raw))

    def flush_cache(self) -> int:
        """Write the cached windows out (store, changelog); how many."""
        return 0 if self.cache is None else self.cache.flush()

    def _write_out(self, entries: Entries) -> None:
        """Windows leaving the cache, in its order: each to its segment, then its changelog
        record. A cached deletion is a ``DELETED`` flag, so no entry is ``None``."""
        for entry, stored in entries:
            assert stored is not None
            key = entry[:-WINDOW_SUFFIX]
            start, end = _TIMES.unpack_from(entry, len(key))
            flags, raw = stored[0], stored[1:]
            self._backend.put_window(key, start, end, flags, raw)
            self._changelog(key, encode_change(start, end, flags, raw))

    def _window(self, raw_key: bytes, start: int, end: int) -> tuple[int, bytes] | None:
        """(flags, value) of one window, the cache's change over the store's."""
        if self.cache is not None:
            cached = self.cache.get(raw_key + _TIMES.pack(start, end))
            if cached is not MISSING:
                stored = cast(bytes, cached)
                return None if stored[0] & DELETED else (stored[0], stored[1:])
        return self._backend.get_window(raw_key, start, end)

    def _windows(
        self,
        low_key: bytes | None,
        high_key: bytes | None,
        start_from: int = 0,
        start_to: int = _TIME_MAX,
        end_from: int = 0,
        end_to: int = _TIME_MAX,
    ) -> Iterator[tuple[bytes, int, int, int, bytes]]:
        """The backend's windows (``WindowBackend.windows``) with the cache's changes in
        those bounds over them, in the backend's order (segment, key, start)."""
        rows = self._backend.windows(low_key, high_key, start_from, start_to, end_from, end_to)
        cache = self.cache
        if cache is None or not len(cache):
            return rows
        if low_key is not None and low_key == high_key:
            cached = cache.entries_of(low_key)
        else:
            cached = cache.entries(
                None if low_key is None else low_key + _TIMES.pack(0, 0),
                None if high_key is None else high_key + _TIMES.pack(_TIME_MAX, _TIME_MAX),
            )
        merged = {(key, start, end): (flags, value) for key, start, end, flags, value in rows}
        for entry, stored in cached:
            assert stored is not None
            key = entry[:-WINDOW_SUFFIX]
            start, end = _TIMES.unpack_from(entry, len(key))
            if (low_key is not None and key < low_key) or (high_key is not None and key > high_key):
                continue
            if not (start_from <= start <= start_to and end_from <= end <= end_to):
                continue
            if stored[0] & DELETED or self._backend.expired(end):
                merged.pop((key, start, end), None)
            else:
                merged[(key, start, end)] = (stored[0], stored[1:])
        segment_of = self._backend.segment_of
        ordered = sorted(merged.items(), key=lambda item: (segment_of(item[0][2]), *item[0][:2]))
        return iter(
            [(key, start, end, flags, value) for (key, start, end), (flags, value) in ordered]
        )

    def get(self, key: Any, start: int | None = None, end: int | None = None) -> Any:
        """The value of ``key``'s window ``[start, end)``; without a window, every window of
        the key as ``fetch`` lists them (what a query of the store answers)."""
        if start is None or end is None:
            return self.fetch(key)
        found = self._window(self._key(key, check=False), start, end)
        return None if found is None else self._spec.value_serde.deserialize(found[1])

    def entry(self, key: Any, start: int, end: int) -> tuple[Any, bool] | None:
        """``key``'s window as (value, whether its final result was emitted), if stored."""
        found = self._window(self._key(key, check=False), start, end)
        if found is None:
            return None
        return self._spec.value_serde.deserialize(found[1]), bool(found[0] & FINAL)

    def is_final(self, key: Any, start: int, end: int) -> bool:
        found = self._window(self._key(key, check=False), start, end)
        return found is not None and bool(found[0] & FINAL)

    def fetch(
        self, key: Any, time_from: int = 0, time_to: int = _TIME_MAX
    ) -> list[tuple[int, int, Any]]:
        """``key``'s windows starting in ``[time_from, time_to]``: (start, end, value)."""
        raw = self._key(key, check=False)
        return [
            (start, end, value)
            for _, start, end, value, _ in self._decoded(
                self._windows(raw, raw, time_from, time_to)
            )
        ]

    def fetch_range(
        self, key_from: Any, key_to: Any, time_from: int = 0, time_to: int = _TIME_MAX
    ) -> list[tuple[Any, int, int, Any]]:
        """Windows of keys in ``[key_from, key_to]`` (key-byte order) starting in the time
        bounds: (key, start, end, value)."""
        low, high = self._key(key_from, check=False), self._key(key_to, check=False)
        return [
            (key, start, end, value)
            for key, start, end, value, _ in self._decoded(
                self._windows(low, high, time_from, time_to)
            )
        ]

    def fetch_all(
        self, time_from: int = 0, time_to: int = _TIME_MAX
    ) -> list[tuple[Any, int, int, Any]]:
        return [
            (key, start, end, value)
            for key, start, end, value, _ in self._decoded(
                self._windows(None, None, time_from, time_to)
            )
        ]

    def sessions(
        self, key: Any, earliest_end: int, latest_start: int
    ) -> list[tuple[int, int, Any, bool]]:
        """``key``'s windows ending at or after ``earliest_end`` and starting at or before
        ``latest_start`` (the sessions a record may merge with): (start, end, value, final)."""
        raw = self._key(key, check=False)
        return [
            (start, end, value, final)
            for _, start, end, value, final in self._decoded(
                self._windows(raw, raw, 0, latest_start, earliest_end)
            )
        ]

    def ended(self, end_from: int, end_to: int) -> list[tuple[Any, int, int, Any, bool]]:
        """This task's windows ending in ``[end_from, end_to]``: (key, start, end, value,
        final), what a final-result emission looks for."""
        return self._decoded(self._windows(None, None, end_from=end_from, end_to=end_to))

    def _decoded(
        self, rows: Iterator[tuple[bytes, int, int, int, bytes]]
    ) -> list[tuple[Any, int, int, Any, bool]]:
        key_serde, value_serde = self._spec.key_serde, self._spec.value_serde
        return [
            (
                key_serde.deserialize(key),
                start,
                end,
                value_serde.deserialize(value),
                bool(flags & FINAL),
            )
            for key, start, end, flags, value in rows
            if in_ranges(self._ranges, key_hash(key, 0))
        ]

    def _key(self, key: Any, *, check: bool) -> bytes:
        raw = self._spec.key_serde.serialize(key)
        if raw is None:
            raise StreamsError(f"store '{self.name}': a store key cannot be None")
        if check and not in_ranges(self._ranges, key_hash(raw, 0)):
            raise StoreKeyOutsideTask(
                f"store '{self.name}': key {key!r} hashes outside this task's key range; "
                "re-key the stream through a topic (a sink and a source) before storing by it"
            )
        return raw
