"""Scans over HTTP against real stores without a broker: a scan reads the stores off the event
loop and only as far as its ``limit`` (one ``/range?limit=1`` of a store of millions once
stalled the loop for seconds, past a session), and a window scan needs no key bounds
(docs/api.md, "Streams instances")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx

from client.http import CoordinatorClient
from client.protocol.keyspace import KeyRange
from client.streams import INT64, JSON, STRING, StoreSpec, Topology
from client.streams.queries import StoreQueries
from client.streams.routes import Request, Routes
from client.streams.runtime import StreamsRuntime
from client.streams.stores import MemoryStore, RocksStore, TaskStore
from client.streams.window_store import TaskWindowStore, open_window_backend
from tests.streams.harness import Count

FULL = KeyRange.full()
# Big enough that reading it all took the loop seconds before scans were lazy and off it.
BIG = 1_500_000


def topology(spec: StoreSpec) -> Any:
    return (
        Topology()
        .add_source("words", "words", key_serde=STRING, value_serde=INT64)
        .add_processor("count", Count, "words")
        .add_state_store(spec, "count")
        .build()
    )


@asynccontextmanager
async def routes_over(spec: StoreSpec, view: object) -> AsyncIterator[Routes]:
    """The routes of an instance whose one active task holds ``view`` as ``spec``'s store."""
    task = SimpleNamespace(active=True, stores={spec.name: view})
    tasks = SimpleNamespace(items=lambda: [(SimpleNamespace(subtopology=0), task)])
    runtime = cast(StreamsRuntime, SimpleNamespace(tasks=tasks))
    partitions: Mapping[str, int] = {"words": 1}
    with ThreadPoolExecutor(2) as scans:
        async with (
            CoordinatorClient("http://coordinator") as coordinator,
            httpx.AsyncClient() as http,
        ):
            queries = StoreQueries(topology(spec), "iq", coordinator, partitions, lambda: runtime)
            yield Routes(queries, http, lambda: "a", credential=None, scans=scans)


async def longest_stall(work: Any) -> tuple[Any, float]:
    """``work``'s result, and the longest the loop went without running a 10 ms ticker
    meanwhile."""
    longest = 0.0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal longest
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            longest = max(longest, now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    try:
        result = await work
    finally:
        done.set()
        await ticker
    return result, longest


async def test_a_range_scan_of_a_big_store_reads_its_limit_off_the_loop(tmp_path: Path) -> None:
    spec = StoreSpec("counts", STRING, INT64, persistent=True)
    backend = RocksStore(tmp_path / "rocksdb")
    batch = 50_000
    for first in range(0, BIG, batch):
        backend.apply(
            (b"k%08d" % n, INT64.serialize(n) or b"") for n in range(first, first + batch)
        )
    store = TaskStore(spec, backend, [FULL], lambda key, value: None)
    try:
        async with routes_over(spec, store) as routes:
            answer, stall = await longest_stall(
                routes.answer(Request("/v1/stores/counts/range", "limit=1"))
            )
            assert answer.status == 200, answer.body
            assert answer.body["entries"] == [{"key": "k00000000", "value": 0}]
            assert answer.body["truncated"] is True
            assert stall < 0.5, f"the loop stalled {stall:.2f} s during a scan of limit 1"

            bounded = await routes.answer(
                Request("/v1/stores/counts/range", "from=k00000010&to=k00000012&limit=2")
            )
            assert [e["key"] for e in bounded.body["entries"]] == ["k00000010", "k00000011"]
            assert bounded.body["truncated"] is True
    finally:
        backend.close()


async def test_a_window_scan_without_key_bounds_lists_every_key_up_to_its_limit() -> None:
    spec = StoreSpec("windows", STRING, JSON, retention_ms=60_000, segment_ms=10_000)
    backend = open_window_backend(spec, None)
    store = TaskWindowStore(spec, backend, [FULL], lambda key, value: None)
    for key in ("b", "a", "c"):
        for start in (0, 1_000):
            store.put(key, start, start + 1_000, {"n": start})
    async with routes_over(spec, store) as routes:
        every = await routes.answer(Request("/v1/stores/windows/windows", ""))
        assert every.status == 200, every.body
        assert [(e["key"], e["start"]) for e in every.body["entries"]] == [
            ("a", 0),
            ("a", 1_000),
            ("b", 0),
            ("b", 1_000),
            ("c", 0),
            ("c", 1_000),
        ]
        assert every.body["truncated"] is False
        limited = await routes.answer(Request("/v1/stores/windows/windows", "limit=3&from_ms=1000"))
        assert [(e["key"], e["start"]) for e in limited.body["entries"]] == [
            ("a", 1_000),
            ("b", 1_000),
            ("c", 1_000),
        ]
        assert limited.body["truncated"] is False
        one = await routes.answer(Request("/v1/stores/windows/windows", "limit=1"))
        assert (len(one.body["entries"]), one.body["truncated"]) == (1, True)
        half = await routes.answer(Request("/v1/stores/windows/windows", "from=a"))
        assert (half.status, half.body["error"]) == (400, "INVALID_REQUEST")


class ClosedUnderTheScan(MemoryStore):
    """A store a revocation may close while a scan reads it."""

    closed = False

    def scan(
        self, low: bytes | None = None, high: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        if self.closed:
            raise RuntimeError("the store is closed")
        yield from super().scan(low, high)


async def test_a_scan_whose_store_closes_under_it_is_a_503_to_retry() -> None:
    spec = StoreSpec("counts", STRING, INT64)
    backend = ClosedUnderTheScan()
    store = TaskStore(spec, backend, [FULL], lambda key, value: None)
    store.put("fox", 1)
    async with routes_over(spec, store) as routes:
        served = await routes.answer(Request("/v1/stores/counts/range", ""))
        assert served.body["entries"] == [{"key": "fox", "value": 1}]
        backend.closed = True
        answer = await routes.answer(Request("/v1/stores/counts/range", ""))
    assert (answer.status, answer.body["error"]) == (503, "STORE_CHANGED"), answer.body
    assert answer.headers == {"Retry-After": "1"}
