"""The workload and the three measured phases of ``bench.commit``: what the committers send,
how each phase drives it (HTTP, the storage layer in-process, raw single-row transactions) and
how a phase is measured (a window of completions, latencies, CPU of the processes involved).
``bench/commit.py`` runs them in rounds against one database and reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import asyncpg
import httpx
import psutil
from prometheus_client import generate_latest

from coordinator.offsets.batching import CommitBatcher
from coordinator.offsets.schemas import CommitRequest

TOPIC = "bench-orders"
HASH_MAX = 2**63 - 1
KEY_HALVES = ((0, HASH_MAX // 2), (HASH_MAX // 2 + 1, HASH_MAX))
# Offsets a slice's watermark moves per commit; the two IC ranges sit inside the next step.
WATERMARK_STEP = 10
IC_RANGES_ABOVE_WATERMARK = ((2, 3), (6, 7))

RAW_UPDATE = (
    "UPDATE partition_offsets SET stable_offset = stable_offset + 1 "
    "WHERE group_id = $1 AND topic = $2 AND partition = $3"
)


# --------------------------------------------------------------------------------------------
# Workload


@dataclass
class Slice:
    partition: int
    hash_start: int
    hash_end: int
    watermark: int = 0
    prefix: bytes = b""

    def __post_init__(self) -> None:
        self.prefix = b'{"topic":"%s","partition":%d,"watermarks":[[%d,%d,' % (
            TOPIC.encode(),
            self.partition,
            self.hash_start,
            self.hash_end,
        )

    def next_entry(self) -> bytes:
        self.watermark += WATERMARK_STEP
        mark = self.watermark
        (low_a, high_a), (low_b, high_b) = IC_RANGES_ABOVE_WATERMARK
        return self.prefix + b'%d]],"ranges":[[%d,%d],[%d,%d]]}' % (
            mark,
            mark + low_a,
            mark + high_a,
            mark + low_b,
            mark + high_b,
        )


@dataclass
class Committer:
    """One client: a block of partitions, one key half of each, walked a few at a time."""

    slices: list[Slice]
    per_commit: int
    cursor: int = 0

    def next_body(self) -> bytes:
        count = len(self.slices)
        entries = [
            self.slices[(self.cursor + i) % count].next_entry() for i in range(self.per_commit)
        ]
        self.cursor = (self.cursor + self.per_commit) % count
        return b'{"member_id":null,"member_epoch":null,"partitions":[' + b",".join(entries) + b"]}"

    def partitions(self) -> Iterator[int]:
        """Endless walk over the block, for the raw phase."""
        index = self.cursor
        while True:
            yield self.slices[index % len(self.slices)].partition
            index += 1


def make_committers(committers: int, partitions: int, per_commit: int) -> list[Committer]:
    blocks = committers // 2
    result = []
    for number in range(committers):
        block = [p for p in range(partitions) if p % blocks == number // 2]
        low, high = KEY_HALVES[number % 2]
        slices = [Slice(p, low, high) for p in block]
        start = 0 if number % 2 == 0 else len(slices) // 2
        result.append(Committer(slices, per_commit, cursor=start))
    return result


# --------------------------------------------------------------------------------------------
# Measurement


@dataclass
class Window:
    """Counts what completes between the end of warm-up and the stop signal."""

    measuring: bool = False
    stopped: bool = False
    done: int = 0
    failed: int = 0
    partition_errors: int = 0
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)

    def record(self, latency: float) -> None:
        if self.measuring:
            self.done += 1
            self.latencies.append(latency)

    def fail(self, reason: str) -> None:
        if self.measuring:
            self.failed += 1
        self.failures[reason[:200]] += 1


@dataclass
class PhaseResult:
    name: str
    rate: float
    p50_ms: float
    p99_ms: float
    failed: int
    partition_errors: int
    cpu_cores: dict[str, float]
    failures: Counter[str]
    done: int = 0
    elapsed_s: float = 0.0
    latencies: list[float] = field(default_factory=list, repr=False)


_BATCH_METRIC = "keyrange_commit_batch_requests"


def batch_totals_of(exposition: str) -> tuple[float, float]:
    """(requests, transactions) of the group-commit histogram in a /metrics exposition."""
    totals = {"sum": 0.0, "count": 0.0}
    for line in exposition.splitlines():
        name, _, value = line.partition(" ")
        for suffix in totals:
            if name == f"{_BATCH_METRIC}_{suffix}":
                totals[suffix] = float(value)
    return totals["sum"], totals["count"]


async def server_batch_totals(port: int) -> tuple[float, float]:
    async with httpx.AsyncClient() as client:
        reply = await client.get(f"http://127.0.0.1:{port}/metrics")
        return batch_totals_of(reply.text)


def local_batch_totals() -> tuple[float, float]:
    return batch_totals_of(generate_latest().decode())


def difference(after: tuple[float, float], before: tuple[float, float]) -> tuple[float, float]:
    return after[0] - before[0], after[1] - before[1]


def merge_rounds(rounds: list[PhaseResult]) -> PhaseResult:
    """One figure over all rounds of a phase: commits over measured time, pooled latencies,
    CPU weighted by time."""
    elapsed = sum(r.elapsed_s for r in rounds)
    done = sum(r.done for r in rounds)
    latencies = sorted(latency for r in rounds for latency in r.latencies)
    failures: Counter[str] = Counter()
    for r in rounds:
        failures.update(r.failures)
    return PhaseResult(
        name=rounds[0].name,
        rate=done / elapsed,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        failed=sum(r.failed for r in rounds),
        partition_errors=sum(r.partition_errors for r in rounds),
        cpu_cores={
            name: sum(r.cpu_cores[name] * r.elapsed_s for r in rounds) / elapsed
            for name in rounds[0].cpu_cores
        },
        failures=failures,
        done=done,
        elapsed_s=elapsed,
        latencies=latencies,
    )


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


class CpuMeter:
    """CPU seconds of the processes that matter, and of the whole machine, over a window."""

    def __init__(self, finders: dict[str, Callable[[], list[psutil.Process]]]) -> None:
        # Postgres forks a backend per connection, so processes are found when a window opens.
        self.finders = finders
        self.processes: dict[str, list[psutil.Process]] = {}
        self._start: dict[str, float] = {}
        self._machine_start = 0.0
        self._wall_start = 0.0

    @staticmethod
    def _seconds(processes: list[psutil.Process]) -> float:
        total = 0.0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    @staticmethod
    def _machine_busy() -> float:
        times = psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    def start(self) -> None:
        self.processes = {name: find() for name, find in self.finders.items()}
        self._start = {name: self._seconds(procs) for name, procs in self.processes.items()}
        self._machine_start = self._machine_busy()
        self._wall_start = time.perf_counter()

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self._wall_start
        cores = {
            name: (self._seconds(procs) - self._start[name]) / wall
            for name, procs in self.processes.items()
        }
        cores["machine"] = (self._machine_busy() - self._machine_start) / wall
        return cores


async def run_phase(
    name: str,
    workers: list[Callable[[Window], Awaitable[None]]],
    warmup_s: float,
    duration_s: float,
    meter: CpuMeter,
    during: Callable[[], Awaitable[None]] | None = None,
) -> PhaseResult:
    window = Window()
    tasks = [asyncio.create_task(worker(window)) for worker in workers]
    try:
        await asyncio.sleep(warmup_s)
        window.measuring = True
        meter.start()
        started = time.perf_counter()
        side = asyncio.create_task(during()) if during else None
        await asyncio.sleep(duration_s)
        window.measuring = False
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
        window.stopped = True
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        if side is not None:
            await side
    finally:
        for task in tasks:
            task.cancel()
    latencies = sorted(window.latencies)
    return PhaseResult(
        name=name,
        rate=window.done / elapsed,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        failed=window.failed,
        partition_errors=window.partition_errors,
        cpu_cores=cpu,
        failures=window.failures,
        done=window.done,
        elapsed_s=elapsed,
        latencies=latencies,
    )


# --------------------------------------------------------------------------------------------
# (a) HTTP


def http_worker(
    committer: Committer, port: int, group_id: str
) -> Callable[[Window], Awaitable[None]]:
    head = (
        b"POST /v1/groups/%s/offsets/commit HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: " % group_id.encode()
    )
    clean_reply = b'"error":null'

    async def run(window: Window) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while not window.stopped:
                body = committer.next_body()
                started = time.perf_counter()
                writer.write(head + b"%d\r\n\r\n" % len(body) + body)
                reply_head = await reader.readuntil(b"\r\n\r\n")
                lowered = reply_head.lower()
                at = lowered.index(b"content-length:") + 15
                length = int(lowered[at : lowered.index(b"\r\n", at)])
                payload = await reader.readexactly(length)
                latency = time.perf_counter() - started
                if reply_head[9:12] != b"200":
                    window.fail(f"HTTP {reply_head[9:12].decode()}: {payload[:160]!r}")
                    continue
                window.record(latency)
                missing = committer.per_commit - payload.count(clean_reply)
                if missing and window.measuring:
                    window.partition_errors += missing
                    window.failures[f"partition errors: {payload[:160]!r}"] += 1
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    return run


# --------------------------------------------------------------------------------------------
# (b) storage layer in-process


def storage_worker(
    requests: list[CommitRequest],
    committer: Committer,
    batcher: CommitBatcher,
    group_id: str,
    parsed_late: list[int],
) -> Callable[[Window], Awaitable[None]]:
    async def run(window: Window) -> None:
        queue = iter(requests)
        while not window.stopped:
            request = next(queue, None)
            if request is None:
                parsed_late[0] += 1
                request = CommitRequest.model_validate_json(committer.next_body())
            started = time.perf_counter()
            try:
                result = await batcher.submit(group_id, request)
            except Exception as exc:
                window.fail(f"{type(exc).__name__}: {exc}")
                continue
            window.record(time.perf_counter() - started)
            errors = sum(1 for p in result.partitions if p[2] is not None)
            if errors and window.measuring:
                window.partition_errors += errors
                window.failures[f"partition errors: {result.partitions}"] += 1

    return run


# --------------------------------------------------------------------------------------------
# (c) raw database ceiling


def raw_worker(
    committer: Committer, pool: asyncpg.Pool, group_id: str
) -> Callable[[Window], Awaitable[None]]:
    async def run(window: Window) -> None:
        walk = committer.partitions()
        async with pool.acquire() as connection:
            while not window.stopped:
                started = time.perf_counter()
                try:
                    await connection.execute(RAW_UPDATE, group_id, TOPIC, next(walk))
                except asyncpg.PostgresError as exc:
                    window.fail(f"{type(exc).__name__}: {exc}")
                    continue
                window.record(time.perf_counter() - started)

    return run
