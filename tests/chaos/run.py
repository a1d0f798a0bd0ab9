"""One chaos run of one runtime (``tests/chaos/members.py``): a coordinator (one or two
replicas behind a balancer) on a Postgres the run is given, a broker of the run's own behind
a proxy it advertises, member processes each behind a coordinator link that can be cut,
Zipf-keyed records (lines, for the word count) flowing while the seeded plan's faults strike,
then the ledger judged."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from coordinator import migrate
from coordinator.embedded import EmbeddedBroker, EmbeddedPostgres
from coordinator.kafka import ClusterMetadata
from tests.chaos import actual
from tests.chaos import faults as kinds
from tests.chaos import members as runtimes
from tests.chaos.checker import Verdict, check
from tests.chaos.counts import Write, check_counts
from tests.chaos.faults import Fault, FaultRecord, plan
from tests.chaos.ledger import (
    read_crashes,
    read_finals,
    read_journals,
    read_splits,
    read_writes,
    store,
)
from tests.chaos.members import Member, Place
from tests.chaos.proxy import TcpProxy
from tests.chaos.traffic import (
    Traffic,
    empty,
    last_values,
    line,
    read_topic,
    sometimes_poison,
    values_in_order,
    view,
)
from tests.chaos.windowed import Emission, FinalResult, check_windows
from tests.e2e.harness import allow_range_fetch
from tests.e2e.processes import CoordinatorProcess, coordinator_settings
from tests.fixtures.coordinator import free_port

logger = logging.getLogger("tests.chaos")

# A slow call's member leaves this long after the call began: it has timed out.
SLOW_CALL_TIMED_OUT_S = runtimes.PROCESSING_TIMEOUT_S + 0.3
# The members' commit interval.
COMMIT_INTERVAL_S = runtimes.COMMIT_INTERVAL_MS / 1000


@dataclass(frozen=True)
class Shape:
    """What a run looks like; with the seed it fixes the fault plan and the keys.
    ``kinds`` and ``rate_per_s`` default to the runtime's."""

    seed: int
    duration_s: float = 60.0
    members: int = 4
    partitions: int = 2
    replicas: int = 2
    session_ms: int = 2_000
    rate_per_s: float = 0.0
    distinct_keys: int = 300
    work_ms: float = 5.0
    kinds: tuple[str, ...] = ()
    runtime: str = runtimes.RUN

    @property
    def session_s(self) -> float:
        return self.session_ms / 1000

    @property
    def block_s(self) -> float:
        return 2.5 * self.session_s

    @property
    def rate(self) -> float:
        return self.rate_per_s or runtimes.RUNTIMES[self.runtime].rate_per_s

    @property
    def fault_kinds(self) -> tuple[str, ...]:
        return self.kinds or runtimes.RUNTIMES[self.runtime].kinds

    def plan(self) -> list[Fault]:
        return [
            dataclasses.replace(fault, duration_s=self.block_s)
            if fault.kind == kinds.LOOP_BLOCK
            else fault
            for fault in plan(
                self.seed,
                duration_s=self.duration_s,
                members=self.members,
                replicas=self.replicas,
                session_s=self.session_s,
                kinds=self.fault_kinds,
                extra_s={kinds.SLOW_CALLS: SLOW_CALL_TIMED_OUT_S},
            )
        ]


@dataclass
class Outcome:
    shape: Shape
    verdict: Verdict
    faults: list[FaultRecord]
    produced: dict[int, int]
    stable: dict[int, int]
    coordinator_errors: list[str] = field(default_factory=list)
    # Members that had exited by themselves when the run ended (not stopped by a fault).
    exited: list[str] = field(default_factory=list)


def describe(outcome: Outcome) -> str:
    verdict = outcome.verdict
    shape = outcome.shape
    lines = [
        f"{shape.runtime} seed {shape.seed}: {verdict.records} records, "
        f"replicas {shape.replicas}, members {shape.members}",
        *(
            f"  {f.kind} {f.target} at {f.started:.2f} for {f.ended - f.started:.2f} s"
            + (f" (two at once #{f.pair})" if f.pair else "")
            for f in outcome.faults
        ),
        f"  recovery {verdict.recovery_s}",
        f"  duplicates per fault {verdict.duplicates_per_fault}",
        f"  unfinished {verdict.unfinished}",
    ]
    for name in (
        "lost",
        "overlaps",
        "zombie_handouts",
        "order_violations",
        "excess_duplicates",
        "frozen_in_handler",
        "undercounted",
        "unexplained_surplus",
        "restore_mismatches",
        "regressions",
        "frozen_writes",
        "delayed_writes",
        "final_repeats",
        "final_repeats_after_crash",
    ):
        found = getattr(verdict, name)
        lines.append(f"  {name}: {len(found)} {found[:5]}")
    lines.extend(f"  exited by itself: {line}" for line in outcome.exited)
    lines.extend(f"  coordinator: {line}" for line in outcome.coordinator_errors[:10])
    return "\n".join(lines)


@dataclass
class Outputs:
    """What the members wrote besides their journals: the records on the dead-letter
    topic (origin partition, offset), the word count's sink and changelog (word to count)."""

    dead_lettered: frozenset[tuple[int, int]] = frozenset()
    final: dict[str, int] = field(default_factory=dict)
    restored: dict[str, int] = field(default_factory=dict)
    changelog: dict[str, list[int]] = field(default_factory=dict)
    # The page views' final results, in each partition's order.
    finals: list[FinalResult] = field(default_factory=list)


class ChaosRun:
    """Owns every process and proxy of one run; ``run()`` returns the judged outcome."""

    def __init__(self, shape: Shape, *, postgres: EmbeddedPostgres, directory: Path) -> None:
        self.shape = shape
        self.postgres = postgres
        self.broker = EmbeddedBroker(directory / "broker")
        self.broker_proxy = TcpProxy([])
        self.directory = directory
        suffix = f"{shape.seed}-{uuid.uuid4().hex[:6]}"
        topic = f"chaos-{suffix}"
        self.place = Place(
            bootstrap="",
            group=f"chaos-{suffix}",
            topic=topic,
            session_ms=shape.session_ms,
            directory=directory,
            work_ms=shape.work_ms,
            block_ms=shape.block_s * 1000,
            words=f"{topic}-words",
            counts=f"{topic}-counts",
            finals=f"{topic}-finals",
            dead_letters=f"{topic}.dead-letters",
        )
        self.replicas: list[CoordinatorProcess] = []
        self.balancer: TcpProxy | None = None
        self.links: dict[str, TcpProxy] = {}
        self.workers: dict[str, Member] = {}
        self.gone: list[Member] = []
        self.extras = 0
        self.controls = 0
        self.records: list[FaultRecord] = []
        self.database_url = ""

    @property
    def runtime(self) -> str:
        return self.shape.runtime

    async def run(self) -> Outcome:
        try:
            await self._set_up()
            windowed = self.runtime == runtimes.STREAMS_WINDOWED
            traffic = Traffic(
                self.place.bootstrap,
                self.place.topic,
                seed=self.shape.seed,
                rate_per_s=self.shape.rate,
                distinct_keys=self.shape.distinct_keys,
                values={
                    runtimes.STREAMS: line,
                    runtimes.STREAMS_WINDOWED: view,
                    runtimes.RUN: empty,
                }.get(self.runtime, sometimes_poison),
                event_step_ms=runtimes.VIEW_STEP_MS if windowed else 0,
                close_after_ms=10 * runtimes.WINDOW_MS if windowed else 0,
            )
            traffic.start()
            await self._until_every_member_works()
            started = time.monotonic()
            injections = []
            for fault in self.shape.plan():
                await asyncio.sleep(max(0.0, started + fault.at_s - time.monotonic()))
                injections.append(asyncio.create_task(self._inject(fault)))
            await asyncio.sleep(max(0.0, started + self.shape.duration_s - time.monotonic()))
            self.records = sorted(await asyncio.gather(*injections), key=lambda r: r.started)
            produced = await traffic.stop()
            if self.runtime == runtimes.STREAMS:
                await self._until_all_committed(self.place.topic, produced)
                _, produced = await read_topic(
                    self.place.bootstrap, self.place.words, self.shape.partitions
                )
            stable = await self._until_all_committed(self.input_topic, produced)
            exited = [
                f"{name} exited with {member.process.returncode}: {member.last_line()}"
                for name, member in self.workers.items()
                if member.process is not None and member.process.returncode is not None
            ]
            for worker in self.workers.values():
                await worker.stop()
            outputs = await self._read_outputs()
        finally:
            await self._tear_down()
        verdict = await self._judge(produced, stable, traffic, outputs)
        # Every finding, where describe() shows the first few.
        (self.directory / "verdict.json").write_text(json.dumps(dataclasses.asdict(verdict)))
        errors = [line for replica in self.replicas for line in replica.error_lines()]
        return Outcome(self.shape, verdict, self.records, produced, stable, errors, exited)

    @property
    def input_topic(self) -> str:
        """The topic whose records the ledger's calls handle."""
        return self.place.words if self.runtime == runtimes.STREAMS else self.place.topic

    async def _read_outputs(self) -> Outputs:
        """The dead letters (origin partition and offset), or the word count's final counts
        (the sink) and its restore (the changelog), each read to its high watermark."""
        bootstrap, partitions = self.place.bootstrap, self.shape.partitions
        if self.runtime == runtimes.STREAMS:
            sink, _ = await read_topic(bootstrap, self.place.counts, partitions)
            changelog, _ = await read_topic(
                bootstrap, f"{self.place.group}-counts-changelog", partitions
            )
            return Outputs(
                final=last_values(sink),
                restored=last_values(changelog),
                changelog=values_in_order(changelog),
            )
        if self.runtime == runtimes.STREAMS_WINDOWED:
            results, _ = await read_topic(bootstrap, self.place.finals, partitions)
            finals = []
            for result in sorted(results, key=lambda record: (record.partition, record.offset)):
                assert result.key is not None and result.value is not None
                window = json.loads(result.value)
                finals.append(FinalResult(result.key.decode(), window["start"], window["views"]))
            return Outputs(finals=finals)
        if self.runtime == runtimes.RUN:
            return Outputs()
        letters, _ = await read_topic(bootstrap, self.place.dead_letters, partitions)
        origins = set()
        for letter in letters:
            headers = {name: value.decode() for name, value in letter.headers}
            origins.add(
                (
                    int(headers["keyrange.origin.partition"]),
                    int(headers["keyrange.origin.offset"]),
                )
            )
        return Outputs(dead_lettered=frozenset(origins))

    async def _judge(
        self,
        produced: dict[int, int],
        stable: dict[int, int],
        traffic: Traffic,
        outputs: Outputs,
    ) -> Verdict:
        names = sorted({*self.workers, *(member.name for member in self.gone)})
        journals = [self.place.journal(name) for name in names]
        runs, blocks = read_journals(journals)
        self.records = actual.with_actual_blocks(self.records, blocks)
        if self.runtime in runtimes.STREAMS_RUNTIMES:
            self.records = actual.from_stuck_calls(self.records, runs)
        exits: dict[str, list[float]] = {}
        for member in [*self.gone, *self.workers.values()]:
            exits.setdefault(member.name, []).extend(member.exits)
        (self.directory / "faults.json").write_text(
            json.dumps(
                {
                    "runtime": self.runtime,
                    "faults": [dataclasses.asdict(fault) for fault in self.records],
                    "produced": produced,
                    "stable": stable,
                    "exits": exits,
                }
            )
        )
        ledger = await store(self.database_url, self.shape.seed, runs)
        concurrency = runtimes.RUNTIMES[self.runtime].concurrency
        verdict = check(
            ledger,
            self.records,
            produced,
            session_s=self.shape.session_s,
            commit_interval_s=COMMIT_INTERVAL_S,
            in_flight=(self.shape.members + 1) * concurrency,
            stable=stable,
            exits=exits,
            processing_timeout_s=None
            if self.runtime in {runtimes.RUN, *runtimes.STREAMS_RUNTIMES}
            else runtimes.PROCESSING_TIMEOUT_S,
            dead_lettered=outputs.dead_lettered,
            # The streams' processors run on the event loop: one stuck on a call blocks the
            # loop as a synchronous handler does.
            frozen_kinds=kinds.FREEZING | {kinds.STUCK_HANDLER, kinds.SIGTERM_DRAIN}
            if self.runtime in runtimes.STREAMS_RUNTIMES
            else kinds.FREEZING,
        )
        if self.runtime == runtimes.STREAMS_WINDOWED:
            crashes = read_crashes(journals)
            for fault in self.records:
                if fault.kind == kinds.MEMBER_KILL:
                    crashes.setdefault(fault.target, []).append(fault.exited or fault.started)
            windows = check_windows(
                traffic.stamped,
                runtimes.WINDOW_MS,
                ledger,
                outputs.finals,
                [Emission(*final) for final in read_finals(journals)],
                crashes,
            )
            return dataclasses.replace(verdict, **dataclasses.asdict(windows))
        if self.runtime != runtimes.STREAMS:
            return verdict
        counted = check_counts(
            traffic.sent,
            read_splits(journals),
            ledger,
            outputs.final,
            outputs.restored,
            outputs.changelog,
            [Write(*write) for write in read_writes(journals)],
            actual.spans_of(self.records, kinds.MEMBER_FREEZE),
            actual.spans_of(self.records, kinds.BROKER_LINK),
        )
        return dataclasses.replace(verdict, **dataclasses.asdict(counted))

    async def _set_up(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Members reach the broker where it says it is: through the proxy, which can cut one
        # member's connections and not the others'.
        await self.broker_proxy.start()
        self.broker.advertised_port = self.broker_proxy.port
        bootstrap = await asyncio.to_thread(self.broker.start)
        self.place = dataclasses.replace(self.place, bootstrap=bootstrap)
        host, port = bootstrap.rsplit(":", 1)
        self.broker_proxy.upstreams = [(host, int(port))]
        name = f"chaos_{self.shape.seed}_{uuid.uuid4().hex[:8]}"
        self.database_url = await asyncio.to_thread(self.postgres.create_database, name)
        await asyncio.to_thread(migrate.upgrade, self.database_url)
        topics = [self.place.topic]
        if self.runtime == runtimes.STREAMS:
            topics += [self.place.words, self.place.counts]
        elif self.runtime == runtimes.STREAMS_WINDOWED:
            topics.append(self.place.finals)
        elif self.runtime != runtimes.RUN:
            topics.append(self.place.dead_letters)
        async with ClusterMetadata(bootstrap, request_timeout_ms=10_000) as cluster:
            for topic in topics:
                await cluster.create_topic(topic, self.shape.partitions)
        settings = coordinator_settings(
            self.database_url, bootstrap, session_timeout_ms=self.shape.session_ms
        )
        for index in range(self.shape.replicas):
            replica = CoordinatorProcess(
                settings, port=free_port(), log_path=self.directory / f"coordinator-{index}.log"
            )
            self.replicas.append(replica)
            await replica.start()
        self.balancer = await TcpProxy([("127.0.0.1", r.port) for r in self.replicas]).start()
        for topic in topics[:2] if self.runtime == runtimes.STREAMS else topics[:1]:
            await allow_range_fetch(self.balancer.url, topic)
        for index in range(self.shape.members):
            await self._start(f"m{index}")

    async def _start(self, name: str) -> Member:
        if name not in self.links:
            assert self.balancer is not None
            self.links[name] = await TcpProxy([("127.0.0.1", self.balancer.port)]).start()
        member = Member(
            name,
            self.runtime,
            runtimes.command(self.runtime, name, self.links[name].url, self.place),
            runtimes.environment(name, self.place),
            self.directory / f"{name}.log",
        )
        self.workers[name] = await member.start()
        return member

    async def _until_every_member_works(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(_has_started(self.place.journal(name)) for name in self.workers):
            if time.monotonic() > deadline:
                raise AssertionError(f"not every member handled a record within {timeout_s} s")
            await asyncio.sleep(0.2)

    def _control(self, name: str, sleep_s: float, calls: int) -> None:
        """``calls`` calls of ``name`` starting within the window sleep ``sleep_s`` first."""
        path = Path(f"{self.place.journal(name)}.control")
        self.controls += 1
        asked = {
            "id": self.controls,
            "until": time.monotonic() + runtimes.STUCK_WINDOW_S,
            "calls": calls,
            "sleep_s": sleep_s,
        }
        path.with_suffix(".tmp").write_text(json.dumps(asked))
        os.replace(path.with_suffix(".tmp"), path)

    async def _join_for(
        self, seconds: float, count: int = 1, *, stuck: tuple[str, int] | None = None
    ) -> str:
        """``count`` members join for ``seconds``, then leave gracefully (scale-out, then
        scale-in); their names. With ``stuck`` (a member, how many of its calls), those
        calls get stuck once the joining members have started, so they are stuck when the
        rebalance revokes keys (starting a process takes seconds on a busy machine)."""
        names = [f"x{self.extras + index}" for index in range(count)]
        self.extras += count
        joined = [await self._start(name) for name in names]
        if stuck is not None:
            deadline = time.monotonic() + 30
            while not all(_has_booted(self.place.journal(name)) for name in names):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            self._control(stuck[0], runtimes.STUCK_S, calls=stuck[1])
        await asyncio.sleep(seconds)
        for member in joined:
            await member.stop()
            self.gone.append(self.workers.pop(member.name))
        return ",".join(names)

    async def _away_for(self, name: str, seconds: float) -> float | None:
        """``name`` stops gracefully (at once, or once asked to), and is back after
        ``seconds``; when it exited."""
        member = self.workers[name]
        await member.stop()
        self.gone.append(member)
        await asyncio.sleep(seconds)
        await self._start(name)
        return member.exits[-1] if member.exits else None

    async def _inject(self, fault: Fault) -> FaultRecord:
        logger.info("fault %s", fault)
        started = time.monotonic()
        target = fault.target
        exited = None
        if fault.kind == kinds.MEMBER_KILL:
            member = self.workers[fault.target]
            await member.kill()
            self.gone.append(member)
            exited = member.exits[-1]
            await asyncio.sleep(fault.duration_s)
            await self._start(fault.target)
        elif fault.kind == kinds.MEMBER_FREEZE:
            self.workers[fault.target].signal_all(signal.SIGSTOP)
            await asyncio.sleep(fault.duration_s)
            self.workers[fault.target].signal_all(signal.SIGCONT)
        elif fault.kind == kinds.LOOP_BLOCK:
            self.workers[fault.target].signal(signal.SIGUSR1)
            await asyncio.sleep(fault.duration_s)
        elif fault.kind == kinds.COORDINATOR_KILL:
            replica = self.replicas[int(fault.target)]
            await replica.kill()
            await asyncio.sleep(fault.duration_s)
            await _restart(replica)
        elif fault.kind == kinds.POSTGRES_STOP:
            await asyncio.to_thread(self.postgres.stop)
            # The database commits until the stop has taken hold, so a heartbeat sent just
            # after the stop began may still renew a session: the fault starts once it is down.
            started = time.monotonic()
            await asyncio.sleep(fault.duration_s)
            await asyncio.to_thread(self.postgres.start)
        elif fault.kind == kinds.COORDINATOR_LINK:
            self.links[fault.target].cut(fault.mode)
            await asyncio.sleep(fault.duration_s)
            self.links[fault.target].heal()
        elif fault.kind == kinds.BROKER_LINK:
            pid = self.workers[fault.target].pid
            self.broker_proxy.cut(fault.mode, only_pids=frozenset({pid}))
            await asyncio.sleep(fault.duration_s)
            self.broker_proxy.heal()
        elif fault.kind == kinds.STUCK_HANDLER:
            # Two joining members take part of the stuck member's keys from it.
            stuck = 1 if self.runtime in runtimes.STREAMS_RUNTIMES else 3
            await self._join_for(fault.duration_s, count=2, stuck=(fault.target, stuck))
        elif fault.kind == kinds.SLOW_CALLS:
            # Once the call timed out (its retry waits for it), the member leaves: every
            # key it had moves.
            self._control(fault.target, runtimes.SLOW_S, calls=1)
            await asyncio.sleep(SLOW_CALL_TIMED_OUT_S)
            exited = await self._away_for(fault.target, fault.duration_s - SLOW_CALL_TIMED_OUT_S)
        elif fault.kind == kinds.SIGTERM_DRAIN:
            self._control(fault.target, runtimes.STUCK_S, calls=1)
            await asyncio.sleep(runtimes.STUCK_WINDOW_S / 2)
            exited = await self._away_for(fault.target, fault.duration_s)
        elif fault.kind == kinds.SCALE_OUT:
            target = await self._join_for(fault.duration_s)
        elif fault.kind == kinds.SCALE_IN:
            exited = await self._away_for(fault.target, fault.duration_s)
        else:
            raise ValueError(f"unknown fault kind {fault.kind}")
        # Killing the only replica cuts every member off, as a Postgres stop does.
        if fault.kind == kinds.COORDINATOR_KILL and len(self.replicas) == 1:
            target = kinds.EVERYONE
        return FaultRecord(
            fault.kind, target, started, time.monotonic(), exited=exited, pair=fault.pair
        )

    async def _until_all_committed(
        self, topic: str, produced: dict[int, int], timeout_s: float = 90
    ) -> dict[int, int]:
        """Once faults stop, the group's stable offset must reach each partition's end."""
        assert self.balancer is not None
        stable: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.balancer.url) as api:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    reply = await api.get(
                        f"/v1/admin/groups/{self.place.group}/offsets", params={"topic": topic}
                    )
                    if reply.status_code == 200:
                        stable = {
                            entry["partition"]: entry["stable_offset"]
                            for entry in reply.json()["partitions"]
                        }
                if all(stable.get(p, 0) >= end for p, end in produced.items()):
                    break
                await asyncio.sleep(0.2)
        return stable

    async def _tear_down(self) -> None:
        for worker in self.workers.values():
            await worker.stop(timeout_s=15)
        for link in self.links.values():
            await link.stop()
        if self.balancer is not None:
            await self.balancer.stop()
        for replica in self.replicas:
            await replica.stop()
        await self.broker_proxy.stop()
        await asyncio.to_thread(self.broker.stop)
        if not self.postgres.running:
            await asyncio.to_thread(self.postgres.start)


async def _restart(replica: CoordinatorProcess, within_s: float = 60) -> None:
    """Start the replica again, and again while it exits at once (Postgres stopped by a
    fault at the same time), as a pod restarts until it stays up."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            await replica.start()
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def _has_booted(path: Path) -> bool:
    return path.exists() and b'"boot"' in path.read_bytes()


def _has_started(path: Path) -> bool:
    return path.exists() and b'"start"' in path.read_bytes()
