"""Heartbeat load on one coordinator process: ``--groups`` (20) groups of
``--members-per-group`` (100) simulated members, each heartbeating at the interval the
coordinator asks for (3 s by default), measured for ``--duration`` (60) seconds once every
group has converged. All members join first, as fast as the coordinator admits them; the join
time and the time to converge afterwards are reported, not measured as heartbeat latency.

Reports ``heartbeat_p99_ms`` and ``coordinator_rss_mb`` (the largest RSS sampled while
measuring), against goals of 100 ms and 300 MB. The baseline, measured in the same run with
the same generator, connections and request rate, is ``GET /livez`` (no I/O): the HTTP floor
of this machine, so ``p99_over_http_floor`` does not depend on how fast the machine is.

Each group subscribes to its own topic of ``--partitions`` (16) partitions that accepts range
fetch, so members share partitions by key range, as Keyrange groups bigger than their
partition count do. Partition counts are seeded in the database (no Kafka needed): the
metadata refresh then fails quietly against an unreachable bootstrap, as with Kafka down.

The load generator is cheaper than the server: raw asyncio streams over a small pool of
keep-alive HTTP/1.1 connections, request bytes built by ``%`` formatting, and a reply parsed
only when its bytes differ from the member's previous reply (steady state: never). Its CPU
share is reported.

Prints one line per phase, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import uvloop

from bench.commit import (
    SERVE,
    CpuMeter,
    asyncpg_dsn,
    bench_database,
    coordinator_process,
    find_postmaster,
    foreign_load,
    free_port,
    percentile,
)
from coordinator import migrate

GOALS = {"heartbeat_p99_ms": 100.0, "coordinator_rss_mb": 300.0}
CONVERGENCE_TIMEOUT_S = 300.0
# Requests waiting for a busy group's row lock hold a pooled connection meanwhile; a pool
# bigger than the default keeps them from starving the other groups.
DB_POOL_SIZE = 40
# The coordinator's maximum: members join first, all 2,000 of them, and must still be
# members when they start heartbeating; the measured phase does not depend on it.
SESSION_TIMEOUT_MS = 300_000
RSS_SAMPLE_S = 0.5
JOIN_ATTEMPTS = 5


@dataclass
class Window:
    measuring: bool = False
    stopped: bool = False
    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    sent: int = 0

    def record(self, latency: float) -> None:
        if self.measuring:
            self.latencies.append(latency)
            self.sent += 1

    def fail(self, reason: str) -> None:
        self.failures[reason[:160]] = self.failures.get(reason[:160], 0) + 1


class Connections:
    """A pool of keep-alive HTTP/1.1 connections; one request at a time on each."""

    def __init__(self, port: int, size: int) -> None:
        self.port = port
        self.size = size
        self.idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )

    async def open(self) -> None:
        for _ in range(self.size):
            self.idle.put_nowait(await asyncio.open_connection("127.0.0.1", self.port))

    async def close(self) -> None:
        while not self.idle.empty():
            _, writer = self.idle.get_nowait()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def request(self, head: bytes, body: bytes) -> tuple[bytes, bytes, float]:
        """(status, body, seconds from write to the last byte read)."""
        reader, writer = await self.idle.get()
        try:
            started = time.perf_counter()
            writer.write(head + b"%d\r\n\r\n" % len(body) + body)
            reply_head = await reader.readuntil(b"\r\n\r\n")
            lowered = reply_head.lower()
            at = lowered.index(b"content-length:") + 15
            length = int(lowered[at : lowered.index(b"\r\n", at)])
            payload = await reader.readexactly(length)
            return reply_head[9:12], payload, time.perf_counter() - started
        finally:
            self.idle.put_nowait((reader, writer))


def post_head(path: str) -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " % path.encode()
    )


@dataclass
class Member:
    group_id: str
    topic: str
    member_id: bytes = b""
    epoch: int = 0
    owned: bytes = b"[]"
    interval_s: float = 3.0
    last_reply: bytes = b""

    def join_body(self) -> bytes:
        return b'{"member_epoch":0,"subscribed_topics":["%s"],"session_timeout_ms":%d}' % (
            self.topic.encode(),
            SESSION_TIMEOUT_MS,
        )

    def heartbeat_body(self) -> bytes:
        return b'{"member_id":"%s","member_epoch":%d,"owned":%s}' % (
            self.member_id,
            self.epoch,
            self.owned,
        )

    def accept(self, payload: bytes) -> None:
        """The member now owns what it was assigned and reports it next time."""
        if payload == self.last_reply:
            return
        self.last_reply = payload
        reply = json.loads(payload)
        self.member_id = reply["member_id"].encode()
        self.epoch = reply["member_epoch"]
        self.owned = json.dumps(reply["assignment"], separators=(",", ":")).encode()
        self.interval_s = reply["heartbeat_interval_ms"] / 1000


async def join(member: Member, connections: Connections, window: Window) -> None:
    """Join as a client would: a refused join (the coordinator shedding load) is retried."""
    head = post_head(f"/v1/groups/{member.group_id}/heartbeat")
    for _ in range(JOIN_ATTEMPTS):
        status, payload, _ = await connections.request(head, member.join_body())
        if status == b"200":
            member.accept(payload)
            return
        window.fail(f"join: HTTP {status.decode()}: {payload[:120]!r}")
    raise SystemExit(f"a member could not join in {JOIN_ATTEMPTS} attempts: {window.failures}")


def member_worker(
    member: Member, connections: Connections, start_delay: float
) -> Callable[[Window], Awaitable[None]]:
    head = post_head(f"/v1/groups/{member.group_id}/heartbeat")

    async def run(window: Window) -> None:
        await asyncio.sleep(start_delay)
        while not window.stopped:
            due = time.perf_counter() + member.interval_s
            body = member.heartbeat_body() if member.epoch > 0 else member.join_body()
            status, payload, latency = await connections.request(head, body)
            if status == b"200":
                window.record(latency)
                member.accept(payload)
            else:
                window.fail(f"HTTP {status.decode()}: {payload[:120]!r}")
                if status == b"409":
                    member.epoch, member.owned, member.last_reply = 0, b"[]", b""
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

    return run


def floor_worker(
    connections: Connections, interval_s: float, start_delay: float
) -> Callable[[Window], Awaitable[None]]:
    """The baseline: the same request rate against ``/livez``."""
    head = b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "

    async def run(window: Window) -> None:
        await asyncio.sleep(start_delay)
        while not window.stopped:
            due = time.perf_counter() + interval_s
            status, payload, latency = await connections.request(head, b"")
            if status == b"200":
                window.record(latency)
            else:
                window.fail(f"HTTP {status.decode()}: {payload[:120]!r}")
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

    return run


async def seed_topics(database_url: str, topics: list[str], partitions: int) -> None:
    """What the metadata refresh and an admin's topic config would have stored."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await connection.executemany(
            "INSERT INTO topic_metadata (topic, partition_count) VALUES ($1, $2)",
            [(topic, partitions) for topic in topics],
        )
        await connection.executemany(
            "INSERT INTO topic_config (topic, accept_range_fetch) VALUES ($1, true)",
            [(topic,) for topic in topics],
        )
    finally:
        await connection.close()


async def unstable_groups(database_url: str, groups: list[str], members: int) -> int:
    """Groups whose members do not all own exactly their target yet."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        stable = await connection.fetchval(
            """
            SELECT count(*) FROM (
                SELECT group_id FROM members
                WHERE group_id = ANY($1::text[]) AND expires_at > now()
                GROUP BY group_id
                HAVING count(*) = $2
                   AND bool_and(owned = assigned AND assigned = target)
                   AND sum(jsonb_array_length(target)) > 0
            ) settled
            """,
            groups,
            members,
        )
    finally:
        await connection.close()
    return len(groups) - int(stable)


@dataclass
class Phase:
    rate: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    rss_mb: float
    cpu_cores: dict[str, float]
    failures: dict[str, int]


async def measure(
    workers: list[Callable[[Window], Awaitable[None]]],
    duration_s: float,
    meter: CpuMeter,
    server: psutil.Process,
    ready: Callable[[], Awaitable[None]],
) -> Phase:
    window = Window()
    tasks = [asyncio.create_task(worker(window)) for worker in workers]
    rss_peak = 0
    try:
        await ready()
        window.measuring = True
        meter.start()
        started = time.perf_counter()
        while time.perf_counter() - started < duration_s:
            rss_peak = max(rss_peak, server.memory_info().rss)
            await asyncio.sleep(RSS_SAMPLE_S)
        window.measuring = False
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
        window.stopped = True
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    latencies = sorted(window.latencies)
    return Phase(
        rate=window.sent / elapsed,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        max_ms=(latencies[-1] if latencies else float("nan")) * 1000,
        rss_mb=rss_peak / 2**20,
        cpu_cores=cpu,
        failures=window.failures,
    )


def describe(name: str, phase: Phase) -> str:
    cpu = " ".join(f"{k}={v:.2f}" for k, v in phase.cpu_cores.items())
    line = (
        f"{name}: {phase.rate:,.0f} req/s p50={phase.p50_ms:.1f}ms p99={phase.p99_ms:.1f}ms "
        f"max={phase.max_ms:.1f}ms rss={phase.rss_mb:.0f}MB cpu_cores[{cpu}]"
    )
    for reason, count in sorted(phase.failures.items(), key=lambda kv: -kv[1])[:3]:
        line += f"\n    {count}x {reason}"
    return line


async def heartbeat_load(
    database_url: str,
    work_dir: Path,
    *,
    groups: int = 20,
    members_per_group: int = 100,
    partitions: int = 16,
    duration_s: float = 60.0,
    connections: int = 32,
) -> dict[str, object]:
    """Run both phases against a fresh coordinator process; returns the summary keys."""
    run_id = uuid.uuid4().hex[:8]
    group_ids = [f"bench-hb-{run_id}-{index:02d}" for index in range(groups)]
    topics = [f"bench-hb-{run_id}-topic-{index:02d}" for index in range(groups)]
    await seed_topics(database_url, topics, partitions)
    rng = random.Random(run_id)
    members = [
        Member(group_id, topic)
        for group_id, topic in zip(group_ids, topics, strict=True)
        for _ in range(members_per_group)
    ]
    me = psutil.Process()
    postmaster = await find_postmaster(database_url)

    def postgres() -> list[psutil.Process]:
        if postmaster is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [postmaster, *postmaster.children()]
        return []

    port = free_port()
    os.environ.setdefault("KEYRANGE_DB_POOL_SIZE", str(DB_POOL_SIZE))
    with coordinator_process(SERVE, database_url, port, work_dir / "coordinator.log") as server:
        pool = Connections(port, connections)
        await pool.open()
        try:
            meter = CpuMeter(
                {"generator": lambda: [me], "server": lambda: [server], "postgres": postgres}
            )
            # Everyone joins first, as fast as the coordinator admits them: a join storm is
            # the worst start, and heartbeats that arrive mid-storm only slow it down.
            started = time.perf_counter()
            join_window = Window()
            await asyncio.gather(*(join(m, pool, join_window) for m in members))
            joined_s = time.perf_counter() - started
            print(f"{len(members)} joins in {joined_s:.1f}s {join_window.failures}", flush=True)
            join_failures = sum(join_window.failures.values())
            interval_s = members[0].interval_s

            async def converged() -> None:
                deadline = time.perf_counter() + CONVERGENCE_TIMEOUT_S
                while await unstable_groups(database_url, group_ids, members_per_group):
                    if time.perf_counter() > deadline:
                        raise SystemExit("groups did not converge in time")
                    await asyncio.sleep(1.0)
                # One more interval so every member has seen its final reply.
                await asyncio.sleep(interval_s)

            started = time.perf_counter()
            hb = await measure(
                [member_worker(m, pool, rng.uniform(0, interval_s)) for m in members],
                duration_s,
                meter,
                server,
                converged,
            )
            convergence_s = time.perf_counter() - started - duration_s
            print(describe("heartbeat", hb), flush=True)

            async def spread() -> None:
                await asyncio.sleep(interval_s)

            floor = await measure(
                [floor_worker(pool, interval_s, rng.uniform(0, interval_s)) for _ in members],
                min(duration_s, 20.0),
                meter,
                server,
                spread,
            )
            print(describe("livez floor", floor), flush=True)
        finally:
            await pool.close()

    summary: dict[str, object] = {
        "heartbeat_p99_ms": round(hb.p99_ms, 2),
        "heartbeat_p50_ms": round(hb.p50_ms, 2),
        "heartbeats_per_s": round(hb.rate, 1),
        "coordinator_rss_mb": round(hb.rss_mb, 1),
        "http_floor_p99_ms": round(floor.p99_ms, 2),
        "p99_over_http_floor": round(hb.p99_ms / floor.p99_ms, 2) if floor.p99_ms else None,
        "heartbeat_failures": sum(hb.failures.values()),
        "join_s": round(joined_s, 1),
        "join_failures": join_failures,
        "convergence_s": round(convergence_s, 1),
        "heartbeat_cpu_cores": {k: round(v, 2) for k, v in hb.cpu_cores.items()},
        "server_cpu_ms_per_heartbeat": round(1000 * hb.cpu_cores["server"] / hb.rate, 3)
        if hb.rate
        else None,
        "generator_cpu_share": round(hb.cpu_cores["generator"] / hb.cpu_cores["machine"], 3)
        if hb.cpu_cores["machine"]
        else None,
        "foreign_cpu_cores": round(foreign_load(hb.cpu_cores), 2),
        "members": len(members),
        "groups": groups,
        "heartbeat_goals_met": hb.p99_ms <= GOALS["heartbeat_p99_ms"]
        and hb.rss_mb <= GOALS["coordinator_rss_mb"]
        and not hb.failures,
    }
    return summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--members-per-group", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=16, help="partitions per topic")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections")
    return parser.parse_args()


def measure_heartbeats(
    *, duration_s: float, groups: int, members_per_group: int, partitions: int, connections: int
) -> dict[str, Any]:
    """The whole heartbeat-load run on a fresh database; ``bench/assign.py`` calls it too."""
    work_dir = Path(tempfile.mkdtemp(prefix="keyrange-bench-heartbeat-"))
    try:
        with bench_database(work_dir) as (database_url, kind):
            migrate.upgrade(database_url)
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                summary = runner.run(
                    heartbeat_load(
                        database_url,
                        work_dir,
                        groups=groups,
                        members_per_group=members_per_group,
                        partitions=partitions,
                        duration_s=duration_s,
                        connections=connections,
                    )
                )
            summary["database"] = kind
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return summary


def main() -> None:
    args = parse_args()
    summary = measure_heartbeats(
        duration_s=args.duration,
        groups=args.groups,
        members_per_group=args.members_per_group,
        partitions=args.partitions,
        connections=args.connections,
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
