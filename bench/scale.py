"""Waiting members at scale: ``--members`` (10,000) in ``--groups`` (100) groups on one
coordinator process, then on two sharing one Postgres. Each member keeps one heartbeat open at
all times, as the SDK does with prompt hand-offs: it offers ``wait_ms`` (its interval), the
coordinator holds the reply, and the member heartbeats again at once (docs/membership.md).

Per run: ``heartbeat_p99_ms`` (a held reply's lateness past its wait), ``coordinator_rss_mb``
(per replica), ``join_handoff_p99_s`` (from a newcomer's join to the reply granting its whole
target), open connections and descriptors: bench/README.md says what each holds.

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
import time
import uuid
from collections.abc import AsyncIterator
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
from bench.heartbeat import seed_topics, unstable_groups
from coordinator import migrate

GOALS = {"heartbeat_p99_ms": 100.0, "coordinator_rss_mb": 400.0, "join_handoff_p99_s": 0.5}
# Members join first, all of them, and must still be members when they start waiting; the
# interval (3 s) does not depend on it.
SESSION_TIMEOUT_MS = 300_000
CONVERGENCE_TIMEOUT_S = 400.0
JOIN_CONCURRENCY = 64
# The coordinators start with this soft limit, as on many hosts, and must raise it.
INHERITED_OPEN_FILES = 1024
SAMPLE_S = 1.0
ASSIGNOR = b""  # what joins add to ask for ``--assignor``; none: the coordinator's default


# The load generator (its own process) ------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port, limit=1 << 20))

    async def post(self, path: bytes, body: bytes) -> tuple[bytes, bytes]:
        self.writer.write(
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body)
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        lowered = head.lower()
        at = lowered.index(b"content-length:") + 15
        length = int(lowered[at : lowered.index(b"\r\n", at)])
        return head[9:12], await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


@dataclass
class Member:
    group_id: str
    topic: str
    port: int
    connection: Connection | None = None
    member_id: bytes = b""
    epoch: int = 0
    owned: bytes = b"[]"
    wait_ms: int = 3000
    last_reply: bytes = b""
    assignment: list[Any] = field(default_factory=list)

    @property
    def path(self) -> bytes:
        return b"/v1/groups/%s/heartbeat" % self.group_id.encode()

    def join_body(self) -> bytes:
        body = b'{"member_epoch":0,"subscribed_topics":["%s"],"session_timeout_ms":%d%s}'
        return body % (self.topic.encode(), SESSION_TIMEOUT_MS, ASSIGNOR)

    def heartbeat_body(self) -> bytes:
        body = b'{"member_id":"%s","member_epoch":%d,"owned":%s,"wait_ms":%d}'
        return body % (self.member_id, self.epoch, self.owned, self.wait_ms)

    def accept(self, payload: bytes) -> None:
        """The member now owns what it was assigned (it releases and takes up at once) and
        reports it in its next heartbeat."""
        if payload == self.last_reply:
            return
        self.last_reply = payload
        reply = json.loads(payload)
        self.member_id = reply["member_id"].encode()
        self.epoch = reply["member_epoch"]
        self.assignment = reply["assignment"]
        self.owned = json.dumps(self.assignment, separators=(",", ":")).encode()
        self.wait_ms = reply["heartbeat_interval_ms"]

    async def call(self, body: bytes) -> tuple[bytes, bytes]:
        """A kept-alive connection the server closed while idle is replaced, as pools do."""
        for attempt in range(2):
            if self.connection is None:
                self.connection = await Connection.open(self.port)
            try:
                return await self.connection.post(self.path, body)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.connection.close()
                self.connection = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def must(self, body: bytes) -> bytes:
        status, payload = await self.call(body)
        if status != b"200":
            raise SystemExit(f"HTTP {status.decode()}: {payload[:200]!r}")
        return payload


@dataclass
class Steady:
    measuring: bool = False
    stopped: bool = False
    lateness: list[float] = field(default_factory=list)
    woken: int = 0
    failures: dict[str, int] = field(default_factory=dict)

    def fail(self, what: str) -> None:
        self.failures[what[:160]] = self.failures.get(what[:160], 0) + 1


async def wait_loop(member: Member, steady: Steady) -> None:
    """Heartbeat, offering to wait, again and again; a held reply's lateness past its wait is
    the heartbeat's latency."""
    while not steady.stopped:
        wait_s = member.wait_ms / 1000
        started = time.perf_counter()
        status, payload = await member.call(member.heartbeat_body())
        elapsed = time.perf_counter() - started
        if status != b"200":
            steady.fail(f"HTTP {status.decode()}: {payload[:120]!r}")
            if status == b"409":
                member.epoch, member.owned, member.last_reply = 0, b"[]", b""
                await join(member, steady)
            else:
                await asyncio.sleep(wait_s)
            continue
        unchanged = payload == member.last_reply
        member.accept(payload)
        if steady.measuring:
            if unchanged and elapsed >= wait_s:
                steady.lateness.append(elapsed - wait_s)
            else:
                steady.woken += 1


async def join(member: Member, steady: Steady) -> None:
    for _ in range(5):
        status, payload = await member.call(member.join_body())
        if status == b"200":
            member.accept(payload)
            return
        steady.fail(f"join: HTTP {status.decode()}: {payload[:120]!r}")
        await asyncio.sleep(0.5)
    raise SystemExit(f"a member could not join: {steady.failures}")


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def handoff(
    newcomer: Member, database: asyncpg.Connection, steady: Steady, timeout_s: float
) -> float:
    """From the newcomer's join to the reply that gives it its whole target; then it leaves
    and its group settles again."""
    started = time.perf_counter()
    await join(newcomer, steady)
    target = json.loads(
        await database.fetchval(
            "SELECT target::text FROM members WHERE member_id = $1", newcomer.member_id.decode()
        )
    )
    while newcomer.assignment != target:
        if time.perf_counter() - started > timeout_s:
            raise SystemExit(f"a join's hand-off took over {timeout_s} s")
        newcomer.accept(await newcomer.must(newcomer.heartbeat_body()))
    took = time.perf_counter() - started
    await newcomer.must(b'{"member_id":"%s","member_epoch":-1}' % newcomer.member_id)
    return took


async def held_heartbeats_changed(ports: list[int]) -> float:
    """Held heartbeats a change ended, over the coordinators (their ``/metrics``): each is a
    member woken, which then takes a turn on its group's lock. Counted around the joins, a
    cost of a hand-off that the machine's load does not blur."""
    total = 0.0
    for port in ports:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        text = (await reader.read()).decode()
        writer.close()
        for line in text.splitlines():
            if line.startswith('keyrange_heartbeats_held_total{outcome="changed"}'):
                total += float(line.split()[-1])
    return total


async def commands() -> AsyncIterator[dict[str, Any]]:
    """The orchestrator's commands, one JSON object a line on stdin."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        yield json.loads(line)


async def generate(config: dict[str, Any]) -> None:
    """Join every member once; then, per run (a set of coordinator ports), point the members
    at them, let every group settle, measure, time the joins' hand-offs, stop the loops.
    Sessions outlive the change of coordinators, as in a rolling restart."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    global ASSIGNOR
    ASSIGNOR = b',"assignor":"%s"' % config["assignor"].encode() if config["assignor"] else b""
    groups: list[str] = config["groups"]
    topics: list[str] = config["topics"]
    per_group: int = config["members_per_group"]
    members = [
        Member(groups[g], topics[g], 0) for i in range(per_group) for g in range(len(groups))
    ]
    database = await asyncpg.connect(config["dsn"])
    joined = False
    try:
        async for command in commands():
            if "ports" not in command:
                break
            ports: list[int] = command["ports"]
            for index, member in enumerate(members):
                member.port = ports[index % len(ports)]
            if not joined:
                started = time.perf_counter()
                await join_all(members)
                await add_partitions(database, config)
                say(phase="joined", s=round(time.perf_counter() - started, 1))
                joined = True
            await one_run(config, members, ports, database)
            say(phase="done")
    finally:
        await database.close()


async def add_partitions(database: asyncpg.Connection, config: dict[str, Any]) -> None:
    """As the metadata refresh records partitions appearing: counts and a rebalance. Members
    joined while their topics had none, so each is granted its whole target at once, not
    through one hand-off per join (minutes of set-up that is not what is measured)."""
    counts = "UPDATE topic_metadata SET partition_count = $1 WHERE topic = ANY($2::text[])"
    await database.execute(counts, config["partitions"], config["topics"])
    rebalance = "UPDATE groups SET rebalance_requested = true, rebalance_reason = $1"
    await database.execute(f"{rebalance} WHERE group_id = ANY($2)", "new", config["groups"])


async def join_all(members: list[Member]) -> None:
    """Everyone joins first, as fast as the coordinators admit them (each group's joins
    take turns on its lock, so concurrent joins are spread over the groups)."""
    queue: asyncio.Queue[Member] = asyncio.Queue()
    for member in members:
        queue.put_nowait(member)
    steady = Steady()

    async def joiner() -> None:
        while not queue.empty():
            await join(queue.get_nowait(), steady)

    await asyncio.gather(*(joiner() for _ in range(JOIN_CONCURRENCY)))


async def one_run(
    config: dict[str, Any], members: list[Member], ports: list[int], database: asyncpg.Connection
) -> None:
    groups: list[str] = config["groups"]
    topics: list[str] = config["topics"]
    steady = Steady()
    started = time.perf_counter()
    loops = [asyncio.create_task(wait_loop(m, steady)) for m in members]
    try:
        deadline = time.perf_counter() + CONVERGENCE_TIMEOUT_S
        while unstable := await unstable_groups(
            config["database_url"], groups, config["members_per_group"]
        ):
            if time.perf_counter() > deadline:
                raise SystemExit(f"{unstable} groups did not converge in time")
            await asyncio.sleep(1.0)
        # One more wait, so that every member is waiting on a reply with nothing to do.
        await asyncio.sleep(members[0].wait_ms / 1000 + 0.5)
        say(phase="converged", s=round(time.perf_counter() - started, 1))
        steady.measuring = True
        say(phase="measuring")
        await asyncio.sleep(config["duration_s"])
        steady.measuring = False
        lateness = sorted(steady.lateness)
        say(
            phase="measured",
            heartbeats=len(lateness),
            woken=steady.woken,
            p50_ms=round(percentile(lateness, 0.5) * 1000, 2),
            p99_ms=round(percentile(lateness, 0.99) * 1000, 2),
            max_ms=round(lateness[-1] * 1000, 2) if lateness else None,
            failures=steady.failures,
        )
        handoffs = []
        woken_before = await held_heartbeats_changed(ports)
        for index in range(config["handoffs"]):
            group = index % len(groups)
            newcomer = Member(groups[group], topics[group], ports[index % len(ports)])
            timeout_s = config["handoff_timeout_s"]
            handoffs.append(await handoff(newcomer, database, steady, timeout_s))
            if newcomer.connection is not None:
                newcomer.connection.close()
        woken = await held_heartbeats_changed(ports) - woken_before
        taken = sorted(handoffs)
        say(
            phase="handoffs",
            joins=len(taken),
            woken_per_join=round(woken / len(taken), 1) if taken else None,
            p50_s=round(percentile(taken, 0.5), 3),
            p99_s=round(percentile(taken, 0.99), 3),
            max_s=round(taken[-1], 3) if taken else None,
        )
    finally:
        steady.stopped = True
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for member in members:
            if member.connection is not None:
                member.connection.close()
                member.connection = None


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
