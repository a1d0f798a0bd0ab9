"""The record cache (Kafka Streams' ``statestore.cache.max.bytes``, KIP-770): each store of a
task keeps its changed entries, the last value per key (per key and window in a window store),
in memory until the task's next commit, so the store and its changelog take one write per key
per commit rather than one per update, and a DSL table or aggregation forwards one change per
key per commit (a windowed aggregation forwards as it did: every update, or each final result).

The budget (``cache_max_bytes``) is the process's, shared by every task's stores as Kafka
Streams shares it among a thread's tasks. A write that takes the total over it evicts the
oldest changed entries of the store written (written to the store and its changelog, and
forwarded where the store forwards on flush) until the total is under it again. A commit
flushes every cache first (``client.streams.commits``, step 0): an input offset is never
committed ahead of the store writes and changelog records of the records it covers. A
crash before the commit loses the cached entries and those records' offsets together, so
the records are processed again (at-least-once, docs/streams.md).

Pure: the cache hands its entries to a writer it is given; ``client.streams.stores`` writes
them to the backend and the changelog.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Entries = list[tuple[bytes, bytes | None]]

# What an entry costs beyond its key and value bytes (the dict slot and the two objects'
# headers), so a cache of tiny entries is still bounded.
ENTRY_OVERHEAD = 64

# Not in the cache (a cached ``None`` is a deletion).
MISSING = object()

# A window entry's start and end after the record key (``WindowCache``).
WINDOW_SUFFIX = 16


class CacheBudget:
    """The bytes every cache of this process holds, against ``max_bytes``. Updated by the
    thread running a task's round (several with ``processing_threads`` above 1), hence the
    lock."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self._lock = threading.Lock()

    def add(self, size: int) -> bool:
        """Count ``size`` more (or fewer, negative) bytes; whether the total is over."""
        with self._lock:
            self.used += size
            return self.used > self.max_bytes

    @property
    def over(self) -> bool:
        return self.used > self.max_bytes


class StoreCache:
    """One task's changed entries of one store, oldest change first; ``write`` takes entries
    out of it (to the store, the changelog and the flush listener) in that order."""

    def __init__(self, budget: CacheBudget, write: Callable[[Entries], None]) -> None:
        self._budget = budget
        self._write = write
        self._entries: dict[bytes, bytes | None] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: bytes) -> bytes | object | None:
        """The cached value (``None`` for a deletion) or ``MISSING``."""
        return self._entries.get(key, MISSING)

    def put(self, key: bytes, value: bytes | None) -> None:
        """Keep ``value`` as the key's latest change (the newest entry), evicting the oldest
        entries of this store while the process's caches hold more than their budget."""
        entries = self._entries
        old = entries.pop(key, MISSING)
        size = len(value) if value is not None else 0
        if old is MISSING:
            size += len(key) + ENTRY_OVERHEAD
        elif old is not None:
            size -= len(old)  # type: ignore[arg-type]
        entries[key] = value
        self._bytes += size
        if self._budget.add(size):
            self._evict()

    def entries(self, low: bytes | None = None, high: bytes | None = None) -> Entries:
        """The cached entries with keys in ``[low, high]`` (a copy: another thread's task
        may write meanwhile)."""
        return [
            (key, value)
            for key, value in list(self._entries.items())
            if (low is None or key >= low) and (high is None or key <= high)
        ]

    def take(self, key: bytes) -> None:
        """Drop ``key``'s entry unwritten: the caller writes a newer value past the cache."""
        entries = self._entries
        old = entries.pop(key, MISSING)
        if old is MISSING:
            return
        size = len(key) + ENTRY_OVERHEAD + (len(old) if old is not None else 0)  # type: ignore[arg-type]
        self._bytes -= size
        self._budget.add(-size)
        self._forget(key)

    def flush(self) -> int:
        """Write every cached entry out, oldest first; how many."""
        if not self._entries:
            return 0
        flushed = list(self._entries.items())
        self._clear()
        self._write(flushed)
        return len(flushed)

    def discard(self) -> None:
        """Forget the entries unwritten (the task was dropped without a commit: its records
        are processed again by the keys' next owner)."""
        self._clear()

    def _clear(self) -> None:
        self._entries = {}
        self._budget.add(-self._bytes)
        self._bytes = 0
        self._forget_all()

    def _forget(self, key: bytes) -> None:
        """An entry left the cache by eviction (a subclass's index follows)."""

    def _forget_all(self) -> None:
        """Every entry left the cache."""

    def _evict(self) -> None:
        evicted: Entries = []
        entries = self._entries
        # As Kafka Streams: from the store written, oldest first, until the process is under
        # its budget or this store's cache is empty (its newest entry, just written, included).
        while self._budget.over and entries:
            key = next(iter(entries))
            value = entries.pop(key)
            size = len(key) + ENTRY_OVERHEAD + (len(value) if value is not None else 0)
            self._bytes -= size
            self._budget.add(-size)
            self._forget(key)
            evicted.append((key, value))
        if evicted:
            self._write(evicted)


class WindowCache(StoreCache):
    """A window store's cache: an entry's key is the record key's bytes then the window's
    start and end (8 bytes each), as in a segment. Indexed by record key as well, so the
    look-ups a record makes (its key's sessions) read that key's cached windows, not the
    whole cache."""

    def __init__(self, budget: CacheBudget, write: Callable[[Entries], None]) -> None:
        super().__init__(budget, write)
        self._by_key: dict[bytes, set[bytes]] = {}

    def put(self, key: bytes, value: bytes | None) -> None:
        self._by_key.setdefault(key[:-WINDOW_SUFFIX], set()).add(key)
        super().put(key, value)

    def entries_of(self, record_key: bytes) -> Entries:
        """The cached windows of one record key."""
        found = self._by_key.get(record_key)
        if not found:
            return []
        entries = self._entries
        # ``get``, not indexing: a query's thread may read while the task's evicts.
        cached = [(entry, entries.get(entry, MISSING)) for entry in list(found)]
        return [(entry, value) for entry, value in cached if value is not MISSING]  # type: ignore[misc]

    def _forget(self, key: bytes) -> None:
        windows = self._by_key.get(key[:-WINDOW_SUFFIX])
        if windows is not None:
            windows.discard(key)
            if not windows:
                del self._by_key[key[:-WINDOW_SUFFIX]]

    def _forget_all(self) -> None:
        self._by_key = {}
