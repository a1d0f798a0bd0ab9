"""Waiting members at scale: ``--members`` (10,000) in ``--groups`` (100) groups on one
coordinator process, then on two sharing one Postgres. Each member keeps one heartbeat open at
all times, as the SDK does with prompt hand-offs: it offers ``wait_ms`` (its interval), the
coordinator holds the reply, and the member heartbeats again at once (docs/membership.md).

Per run: ``heartbeat_p99_ms`` (a held reply's lateness past its wait), ``coordinator_rss_mb``
(per replica), ``join_handoff_p99_s`` (from a newcomer's join to the reply granting its whole
target), open connections and descriptors, and ``collector_pauses`` (the coordinators' garbage
collections during the measured window and during the joins: how many, how many over 50 ms,
seconds stopped in all): bench/README.md says what each holds.

The load generator is its own process (``python -m bench.scale generate``), so its CPU is
apart from the coordinators'. The coordinators start with a soft open-file limit of 1,024 and
must raise it themselves. Prints one line per phase, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
)
from bench.heartbeat import seed_topics
from bench.scale_generator import generate
from coordinator import migrate

GOALS = {"heartbeat_p99_ms": 100.0, "coordinator_rss_mb": 400.0, "join_handoff_p99_s": 0.5}
# The coordinators start with this soft limit, as on many hosts, and must raise it.
INHERITED_OPEN_FILES = 1024
SAMPLE_S = 1.0


# The orchestrator: database, coordinators, the generator, the meters -----------------------


@dataclass
class Replica:
    process: psutil.Process
    log: Path
    rss_peak: int = 0
    fds_peak: int = 0
    connections_peak: int = 0
    fd_limit: int = 0

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.rss_peak = max(self.rss_peak, self.process.memory_info().rss)
            self.fds_peak = max(self.fds_peak, self.process.num_fds())
            self.fd_limit = self.process.rlimit(psutil.RLIMIT_NOFILE)[0]

    def count_connections(self, port: int) -> None:
        with contextlib.suppress(psutil.Error):
            tcp = self.process.net_connections(kind="tcp")
            served = [c for c in tcp if c.laddr and c.laddr.port == port and c.raddr]
            self.connections_peak = max(self.connections_peak, len(served))

    def figures(self, max_connections: int) -> dict[str, Any]:
        return {
            "rss_mb": round(self.rss_peak / 2**20, 1),
            "open_connections": self.connections_peak,
            "max_connections": max_connections,
            "open_fds": self.fds_peak,
            "fd_limit": self.fd_limit,
            "fd_limit_raise_logged": "raised the open-file limit" in self.log.read_text(),
        }


def lower_open_files() -> None:
    """What the coordinators inherit: a low soft limit, a higher hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, INHERITED_OPEN_FILES), hard))


class Generator:
    """The load generator's process, driven a run at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.psutil = psutil.Process(process.pid)
        self.joined_s: float | None = None

    @classmethod
    async def start(cls, config: dict[str, Any]) -> Generator:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.scale",
            "generate",
            json.dumps(config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=Path(__file__).parent.parent,
        )
        return cls(process)

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")

    async def events(self, label: str) -> AsyncIterator[dict[str, Any]]:
        """The run's events, up to its end."""
        assert self.process.stdout is not None
        while raw := await self.process.stdout.readline():
            event = json.loads(raw)
            print(f"  {label}: {json.dumps(event)}", flush=True)
            if event["phase"] == "done":
                return
            yield event
        raise SystemExit(f"the load generator failed (exit {await self.process.wait()})")

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.send({"stop": True})
        await self.process.wait()


async def run_once(
    database_url: str,
    work_dir: Path,
    replicas: int,
    generator: Generator,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One run against ``replicas`` fresh coordinator processes sharing the database."""
    per_replica = -(-args.members // replicas)
    max_connections = per_replica + args.connection_headroom
    os.environ["KEYRANGE_MAX_CONNECTIONS"] = str(max_connections)
    os.environ.setdefault("KEYRANGE_LOG_LEVEL", "INFO")
    postmaster = await find_postmaster(database_url)
    ports = [free_port() for _ in range(replicas)]
    with contextlib.ExitStack() as stack:
        started = []
        for index, port in enumerate(ports):
            log = work_dir / f"coordinator-{replicas}-{index}.log"
            process = stack.enter_context(coordinator_process(SERVE, database_url, port, log))
            started.append(Replica(process, log))

        def postgres() -> list[psutil.Process]:
            with contextlib.suppress(psutil.Error):
                return [] if postmaster is None else [postmaster, *postmaster.children()]
            return []

        meter = CpuMeter(
            {
                "generator": lambda: [generator.psutil],
                **{f"replica{i}": (lambda r=r: [r.process]) for i, r in enumerate(started)},
                "postgres": postgres,
            }
        )
        phases: dict[str, dict[str, Any]] = {}
        sampler: asyncio.Task[None] | None = None

        async def sample() -> None:
            while True:
                for replica in started:
                    replica.sample()
                await asyncio.sleep(SAMPLE_S)

        generator.send({"ports": ports})
        async for event in generator.events(f"{replicas} replica(s)"):
            phases[event["phase"]] = event
            if event["phase"] == "joined":
                generator.joined_s = event["s"]
            elif event["phase"] == "measuring":
                meter.start()
                sampler = asyncio.create_task(sample())
                load_at_start = os.getloadavg()[0]
            elif event["phase"] == "measured":
                cpu = meter.stop()
                assert sampler is not None
                sampler.cancel()
                for replica, port in zip(started, ports, strict=True):
                    replica.count_connections(port)
                database_connections = await count_database_connections(database_url)
    measured, joins = phases["measured"], phases["handoffs"]
    figures = [replica.figures(max_connections) for replica in started]
    rate = measured["heartbeats"] / args.duration
    server_cores = sum(v for k, v in cpu.items() if k.startswith("replica"))
    return {
        "members": args.members,
        "replicas": replicas,
        "heartbeat_p99_ms": measured["p99_ms"],
        "heartbeat_p50_ms": measured["p50_ms"],
        "heartbeats_per_s": round(rate, 1),
        "coordinator_rss_mb": max(f["rss_mb"] for f in figures),
        "join_handoff_p99_s": joins["p99_s"],
        "join_handoff_p50_s": joins["p50_s"],
        "woken_per_join": joins["woken_per_join"],
        "collector_pauses": {
            "measured": measured["collector_pauses"],
            "handoffs": joins["collector_pauses"],
        },
        "per_replica": figures,
        "database_connections": database_connections,
        "convergence_s": phases["converged"]["s"],
        "failures": measured["failures"],
        "cpu_cores": {k: round(v, 2) for k, v in cpu.items()},
        "server_cpu_ms_per_heartbeat": round(1000 * server_cores / rate, 3) if rate else None,
        "foreign_cpu_cores": round(foreign_load(cpu), 2),
        "load_average": round(load_at_start, 2),
    }


async def run_all(database_url: str, work_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Seed the topics, join the members once, then one run per replica count."""
    run_id = uuid.uuid4().hex[:8]
    groups = [f"bench-scale-{run_id}-{i:03d}" for i in range(args.groups)]
    topics = [f"bench-scale-{run_id}-topic-{i:03d}" for i in range(args.groups)]
    await seed_topics(database_url, topics, 0)
    generator = await Generator.start(
        {
            "groups": groups,
            "topics": topics,
            "partitions": args.partitions,
            "assignor": args.assignor,
            "members_per_group": args.members // args.groups,
            "duration_s": args.duration,
            "handoffs": args.handoffs,
            "handoff_timeout_s": args.handoff_timeout,
            "database_url": database_url,
            "dsn": asyncpg_dsn(database_url),
        }
    )
    summary: dict[str, Any] = {}
    try:
        for replicas in (int(r) for r in args.replicas.split(",")):
            run = await run_once(database_url, work_dir, replicas, generator, args)
            print(json.dumps(run), flush=True)
            if not summary:
                summary.update(run)
                summary["join_s"] = generator.joined_s
                summary["goals_met"] = goals_met(run)
            else:
                summary[f"replicas_{replicas}"] = {**run, "goals_met": goals_met(run)}
    finally:
        await generator.stop()
    return summary


async def count_database_connections(database_url: str) -> int:
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'keyrange%'"
    try:
        return int(await connection.fetchval(query))
    finally:
        await connection.close()


def goals_met(run: dict[str, Any]) -> bool:
    return (
        run["heartbeat_p99_ms"] <= GOALS["heartbeat_p99_ms"]
        and run["coordinator_rss_mb"] <= GOALS["coordinator_rss_mb"]
        and run["join_handoff_p99_s"] <= GOALS["join_handoff_p99_s"]
        and all(f["open_fds"] < f["fd_limit"] for f in run["per_replica"])
    )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "generate":
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(generate(json.loads(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=16, help="partitions per topic")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds")
    parser.add_argument("--handoffs", type=int, default=20, help="joins timed per run")
    parser.add_argument(
        "--handoff-timeout", type=float, default=10.0, help="seconds a join may take (else fail)"
    )
    parser.add_argument("--replicas", default="1,2", help="the runs, by replica count")
    parser.add_argument("--assignor", default="", help="the members' (default: coordinator's)")
    headroom = "KEYRANGE_MAX_CONNECTIONS above the members per replica"
    parser.add_argument("--connection-headroom", type=int, default=2000, help=headroom)
    args = parser.parse_args()
    lower_open_files()
    work_dir = Path(tempfile.mkdtemp(prefix="keyrange-bench-scale-"))
    try:
        with bench_database(work_dir) as (database_url, kind):
            migrate.upgrade(database_url)
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                summary = runner.run(run_all(database_url, work_dir, args))
            summary["database"] = kind
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
