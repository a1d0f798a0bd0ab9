"""Window stores on their own: segments by window end, expiry by stream time, scans by key
and time, and a changelog that restores one key range of them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from client.protocol.keyspace import KeyRange, key_hash
from client.streams import JSON, STRING, StoreSpec
from client.streams.cache import ENTRY_OVERHEAD, CacheBudget
from client.streams.errors import StoreKeyOutsideTask
from client.streams.stores import delete_ranges
from client.streams.window_store import (
    FINAL,
    TaskWindowStore,
    WindowBackend,
    decode_change,
    open_window_backend,
)

FULL = KeyRange.full()
Change = tuple[bytes, bytes | None]


def spec(persistent: bool) -> StoreSpec:
    return StoreSpec("w", STRING, JSON, persistent=persistent, retention_ms=100, segment_ms=50)


@pytest.mark.parametrize("persistent", [False, True])
def test_scans_by_key_and_time_and_expiry_by_stream_time(persistent: bool, tmp_path: Path) -> None:
    backend = open_window_backend(spec(persistent), tmp_path)
    log: list[tuple[bytes, bytes | None]] = []
    store = TaskWindowStore(spec(persistent), backend, [FULL], lambda k, v: log.append((k, v)))
    for key in ("a", "ab", "b"):
        for start in (0, 10, 20):
            store.put(key, start, start + 10, {"n": start})
    assert store.fetch("a") == [(0, 10, {"n": 0}), (10, 20, {"n": 10}), (20, 30, {"n": 20})]
    assert store.fetch("a", 5, 15) == [(10, 20, {"n": 10})]
    assert [row[0] for row in store.fetch_range("a", "ab", 0, 0)] == ["a", "ab"]
    assert store.get("b", 10, 20) == {"n": 10}
    store.put("b", 10, 20, None)
    assert store.get("b", 10, 20) is None
    store.put("a", 0, 10, 5, final=True)
    assert store.entry("a", 0, 10) == (5, True)
    assert len(log) == 11
    # Stream time (the latest end) 200: every window ending before 100 is gone.
    store.put("c", 190, 200, 1)
    assert store.fetch_all() == [("c", 190, 200, 1)]
    if persistent:
        assert [p.name for p in (tmp_path / "segments").iterdir()] == ["4"]
    backend.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_a_changelog_restores_one_key_range(persistent: bool, tmp_path: Path) -> None:
    log: list[tuple[bytes, bytes | None]] = []
    source = open_window_backend(spec(False), None)
    writer = TaskWindowStore(spec(False), source, [FULL], lambda k, v: log.append((k, v)))
    keys = [f"k{index}" for index in range(40)]
    for key in keys:
        writer.put(key, 0, 10, 1)
        writer.put(key, 10, 20, 2)
        writer.put(key, 0, 10, None)
    half = KeyRange(0, KeyRange.full().end // 2)
    mine = [key for key in keys if half.contains(key_hash(key.encode(), 0))]
    restored = open_window_backend(spec(persistent), tmp_path)
    restored.apply((key, value) for key, value in log if half.contains(key_hash(key, 0)))
    view = TaskWindowStore(spec(persistent), restored, [half], lambda k, v: None)
    assert sorted(row[0] for row in view.fetch_all()) == sorted(mine)
    assert all(row[1:] == (10, 20, 2) for row in view.fetch_all())
    with pytest.raises(StoreKeyOutsideTask):
        view.put(next(key for key in keys if key not in mine), 0, 10, 1)
    assert delete_ranges(restored, [half]) == len(mine)
    assert view.fetch_all() == []
    assert isinstance(restored, WindowBackend)
    restored.close()


def test_expiry_waits_for_the_task_furthest_behind() -> None:
    backend = open_window_backend(spec(False), None)
    low, high = KeyRange(0, FULL.end // 2), KeyRange(FULL.end // 2 + 1, FULL.end)
    keys = [f"k{index}" for index in range(20)]
    slow_key = next(key for key in keys if low.contains(key_hash(key.encode(), 0)))
    fast_key = next(key for key in keys if high.contains(key_hash(key.encode(), 0)))
    slow = TaskWindowStore(spec(False), backend, [low], lambda k, v: None)
    fast = TaskWindowStore(spec(False), backend, [high], lambda k, v: None)
    slow.put(slow_key, 0, 10, 1)
    fast.put(fast_key, 990, 1000, 1)
    assert slow.fetch(slow_key) == [(0, 10, 1)]
    slow.put(slow_key, 500, 510, 1)
    # Expiry is looked at as a new segment starts, by the slow task's stream time (510).
    fast.put(fast_key, 1990, 2000, 1)
    assert slow.fetch(slow_key) == [(500, 510, 1)]
    del slow
    # Once the slow task is gone, the fast one alone sets the engine's stream time.
    fast.put(fast_key, 2990, 3000, 1)
    assert [row[:3] for row in backend.windows(None, None)] == [(fast_key.encode(), 2990, 3000)]


# ------------------------------------------------------------------ the record cache


def paired_stores(
    max_bytes: int,
) -> tuple[TaskWindowStore, TaskWindowStore, list[Change], list[Change]]:
    """A cached store and an uncached one, each on its own engine with its own changelog."""
    wide = StoreSpec("w", STRING, JSON, retention_ms=10**9, segment_ms=50)
    cached_log: list[Change] = []
    plain_log: list[Change] = []
    cached = TaskWindowStore(
        wide,
        open_window_backend(wide, None),
        [FULL],
        lambda k, v: cached_log.append((k, v)),
        CacheBudget(max_bytes),
    )
    plain = TaskWindowStore(
        wide, open_window_backend(wide, None), [FULL], lambda k, v: plain_log.append((k, v))
    )
    return cached, plain, cached_log, plain_log


def reads(store: TaskWindowStore, key: str) -> list[object]:
    return [
        store.fetch(key),
        store.fetch(key, 20, 60),
        store.fetch_range("k0", "k2"),
        store.fetch_all(10, 90),
        store.sessions(key, 30, 70),
        store.ended(0, 10**6),
        [store.entry(key, start, start + 10) for start in range(0, 100, 10)],
    ]


def test_a_cached_window_store_reads_as_an_uncached_one_and_logs_each_window_once() -> None:
    cached, plain, cached_log, plain_log = paired_stores(1 << 20)
    steps = random.Random(5)
    for step in range(640):
        key = f"k{steps.randrange(4)}"
        start = steps.randrange(10) * 10
        value = None if steps.random() < 0.15 else {"n": step}
        final = value is not None and steps.random() < 0.1
        for store in (cached, plain):
            store.put(key, start, start + 10, value, final=final)
        assert reads(cached, key) == reads(plain, key), f"step {step}"
        if step % 150 == 149:
            flushed = cached.flush_cache()
            # One changelog record per window changed since the last flush, however often
            # it changed; and the changelog replays to the same windows as the uncached one's.
            assert 0 < flushed == len({(k, v[1:17]) for k, v in cached_log[-flushed:] if v})
            assert len(cached_log) < len(plain_log)
            assert replayed(cached_log) == replayed(plain_log)
    assert cached.flush_cache() > 0 and cached.flush_cache() == 0
    assert replayed(cached_log) == replayed(plain_log)


def replayed(log: list[Change]) -> list[tuple[bytes, int, int, int, bytes]]:
    backend = open_window_backend(StoreSpec("w", STRING, JSON, retention_ms=10**9), None)
    backend.apply(log)
    return list(backend.windows(None, None))


def test_a_full_window_cache_evicts_its_oldest_window_to_the_store_and_changelog() -> None:
    cached, _, log, _ = paired_stores(2 * (ENTRY_OVERHEAD + 2 + 16 + 2) + 4)
    cached.put("k0", 0, 10, 1)
    cached.put("k0", 10, 20, 1)
    cached.put("k0", 0, 10, 2)  # the window [0, 10) becomes the newest
    assert log == []
    cached.put("k1", 0, 10, 1)
    assert [(key, decode_change(value)[:2]) for key, value in log if value] == [(b"k0", (10, 20))]
    assert cached.fetch("k0") == [(0, 10, 2), (10, 20, 1)]
    assert cached.cache is not None and len(cached.cache) == 2
    cached.cache.discard()
    # What was evicted is in the store; the rest is gone with the cache.
    assert cached.fetch_all() == [("k0", 10, 20, 1)]


def test_a_final_mark_goes_past_the_cache_with_the_window_s_last_value() -> None:
    cached, _, log, _ = paired_stores(1 << 20)
    cached.put("k0", 0, 10, 1)
    cached.put("k0", 0, 10, 2)
    cached.put("k1", 0, 10, 1)
    cached.put("k0", 0, 10, 2, final=True)
    # Written at once, and the window's cached updates dropped: none overwrites the mark.
    assert [(key, decode_change(value)) for key, value in log if value] == [
        (b"k0", (0, 10, FINAL, b"2"))
    ]
    assert cached.flush_cache() == 1
    assert cached.entry("k0", 0, 10) == (2, True)
    assert [key for key, _ in log] == [b"k0", b"k1"]
