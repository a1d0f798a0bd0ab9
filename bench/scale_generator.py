"""The load generator of ``bench/scale.py``, run as its own process (``python -m bench.scale
generate``) so that its CPU is metered apart from the coordinators': one raw asyncio stream per
member on uvloop, request bytes built by ``%`` formatting, a reply parsed only when it differs
from the member's previous one. Driven over its stdin and stdout by the orchestrator.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench.commit import percentile
from bench.heartbeat import unstable_groups

# Members join first, all of them, and must still be members when they start waiting; the
# interval (3 s) does not depend on it.
SESSION_TIMEOUT_MS = 300_000
CONVERGENCE_TIMEOUT_S = 400.0
JOIN_CONCURRENCY = 64
ASSIGNOR = b""  # what joins add to ask for ``--assignor``; none: the coordinator's default


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


async def scraped(ports: list[int]) -> list[str]:
    """The coordinators' ``/metrics`` lines."""
    lines = []
    for port in ports:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        lines += (await reader.read()).decode().splitlines()
        writer.close()
    return lines


def summed(lines: list[str], prefix: str) -> float:
    return sum(float(line.split()[-1]) for line in lines if line.startswith(prefix))


async def held_heartbeats_changed(ports: list[int]) -> float:
    """Held heartbeats a change ended, over the coordinators: each is a member woken, which
    then takes a turn on its group's lock. Counted around the joins, a cost of a hand-off
    that the machine's load does not blur."""
    return summed(await scraped(ports), 'keyrange_heartbeats_held_total{outcome="changed"}')


async def collector_pauses(ports: list[int]) -> dict[str, float]:
    """The coordinators' garbage collections so far (``keyrange_gc_pause_seconds``, all
    generations): how many, how many stopped the loop over 50 ms, and for how long in all."""
    lines = await scraped(ports)
    collections = summed(lines, "keyrange_gc_pause_seconds_count")
    within = sum(
        float(line.split()[-1])
        for line in lines
        if line.startswith("keyrange_gc_pause_seconds_bucket") and 'le="0.05"' in line
    )
    return {
        "collections": collections,
        "over_50ms": collections - within,
        "paused_s": summed(lines, "keyrange_gc_pause_seconds_sum"),
    }


def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: round(after[key] - before[key], 3) for key in after}


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
        pauses_before = await collector_pauses(ports)
        steady.measuring = True
        say(phase="measuring")
        await asyncio.sleep(config["duration_s"])
        steady.measuring = False
        pauses_measured = await collector_pauses(ports)
        lateness = sorted(steady.lateness)
        say(
            phase="measured",
            heartbeats=len(lateness),
            woken=steady.woken,
            p50_ms=round(percentile(lateness, 0.5) * 1000, 2),
            p99_ms=round(percentile(lateness, 0.99) * 1000, 2),
            max_ms=round(lateness[-1] * 1000, 2) if lateness else None,
            failures=steady.failures,
            collector_pauses=since(pauses_before, pauses_measured),
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
            collector_pauses=since(pauses_measured, await collector_pauses(ports)),
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
