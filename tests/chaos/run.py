"""One chaos run: a coordinator (one or two replicas behind a balancer) on a Postgres the run
is given, a broker of the run's own behind a proxy it advertises, member processes each behind
a coordinator link that can be cut, Zipf-keyed records flowing while the seeded plan's faults
strike, then the ledger judged."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from aiokafka import AIOKafkaProducer

from coordinator import migrate
from coordinator.embedded import EmbeddedBroker, EmbeddedPostgres
from coordinator.kafka import ClusterMetadata
from tests.chaos import faults as kinds
from tests.chaos.checker import Verdict, check
from tests.chaos.faults import Fault, FaultRecord, plan
from tests.chaos.ledger import Block, read_journals, store
from tests.chaos.proxy import TcpProxy
from tests.e2e.harness import allow_range_fetch
from tests.e2e.processes import CoordinatorProcess, WorkerProcess, coordinator_settings
from tests.fixtures.coordinator import free_port

logger = logging.getLogger("tests.chaos")

# The members' auto-commit interval (``tests/e2e/worker_process.py``).
COMMIT_INTERVAL_S = 0.2


@dataclass(frozen=True)
class Shape:
    """What a run looks like; with the seed it fixes the fault plan and the keys."""

    seed: int
    duration_s: float = 60.0
    members: int = 4
    partitions: int = 2
    replicas: int = 2
    session_ms: int = 2_000
    rate_per_s: float = 100.0
    distinct_keys: int = 300
    work_ms: float = 5.0
    concurrency: int = 4
    kinds: tuple[str, ...] = kinds.KINDS

    @property
    def session_s(self) -> float:
        return self.session_ms / 1000

    @property
    def block_s(self) -> float:
        return 2.5 * self.session_s

    def plan(self) -> list[Fault]:
        return [
            Fault(fault.at_s, fault.kind, fault.target, self.block_s, fault.mode)
            if fault.kind == kinds.LOOP_BLOCK
            else fault
            for fault in plan(
                self.seed,
                duration_s=self.duration_s,
                members=self.members,
                replicas=self.replicas,
                session_s=self.session_s,
                kinds=self.kinds,
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


def describe(outcome: Outcome) -> str:
    verdict = outcome.verdict
    lines = [
        f"seed {outcome.shape.seed}: {verdict.records} records, replicas {outcome.shape.replicas}",
        *(
            f"  {f.kind} {f.target} at {f.started:.2f} for {f.ended - f.started:.2f} s"
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
    ):
        found = getattr(verdict, name)
        lines.append(f"  {name}: {len(found)} {found[:5]}")
    lines.extend(f"  coordinator: {line}" for line in outcome.coordinator_errors[:10])
    return "\n".join(lines)


class Traffic:
    """Zipf-keyed records at a steady rate, keyed so the producer's partitioner spreads them;
    remembers each partition's end offset from the acknowledgements."""

    def __init__(self, bootstrap: str, topic: str, shape: Shape) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.shape = shape
        self.ends: dict[int, int] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="chaos-traffic")

    async def stop(self) -> dict[int, int]:
        self._stop.set()
        if self._task is not None:
            await self._task
        return dict(self.ends)

    async def _run(self) -> None:
        rng = random.Random(self.shape.seed)
        names = [b"key-%d" % rank for rank in range(self.shape.distinct_keys)]
        weights = [1.0 / rank for rank in range(1, len(names) + 1)]
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks=1, enable_idempotence=False, linger_ms=5
        )
        await producer.start()
        tick_s = 0.05
        batch = max(1, round(self.shape.rate_per_s * tick_s))
        try:
            while not self._stop.is_set():
                deliveries = [
                    await producer.send(self.topic, key=key, value=b"")
                    for key in rng.choices(names, weights=weights, k=batch)
                ]
                for delivery in deliveries:
                    metadata = await delivery
                    end = metadata.offset + 1
                    self.ends[metadata.partition] = max(self.ends.get(metadata.partition, 0), end)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), tick_s)
        finally:
            await producer.stop()


class ChaosRun:
    """Owns every process and proxy of one run; ``run()`` returns the judged outcome."""

    def __init__(self, shape: Shape, *, postgres: EmbeddedPostgres, directory: Path) -> None:
        self.shape = shape
        self.postgres = postgres
        self.broker = EmbeddedBroker(directory / "broker")
        self.broker_proxy = TcpProxy([])
        self.bootstrap = ""
        self.directory = directory
        self.group = f"chaos-{shape.seed}-{uuid.uuid4().hex[:6]}"
        self.topic = f"chaos-{shape.seed}-{uuid.uuid4().hex[:6]}"
        self.replicas: list[CoordinatorProcess] = []
        self.balancer: TcpProxy | None = None
        self.links: dict[str, TcpProxy] = {}
        self.workers: dict[str, WorkerProcess] = {}
        self.records: list[FaultRecord] = []
        self.database_url = ""

    def journal(self, name: str) -> Path:
        return self.directory / f"{name}.jsonl"

    async def run(self) -> Outcome:
        try:
            await self._set_up()
            traffic = Traffic(self.bootstrap, self.topic, self.shape)
            traffic.start()
            await self._until_every_member_works()
            started = time.monotonic()
            for fault in self.shape.plan():
                await asyncio.sleep(max(0.0, started + fault.at_s - time.monotonic()))
                self.records.append(await self._inject(fault))
            await asyncio.sleep(max(0.0, started + self.shape.duration_s - time.monotonic()))
            produced = await traffic.stop()
            stable = await self._until_all_committed(produced)
            for worker in self.workers.values():
                await worker.close()
        finally:
            await self._tear_down()
        runs, blocks = read_journals([self.journal(name) for name in self.workers])
        faults = _with_actual_blocks(self.records, blocks)
        (self.directory / "faults.json").write_text(
            json.dumps(
                {
                    "faults": [dataclasses.asdict(fault) for fault in faults],
                    "produced": produced,
                    "stable": stable,
                }
            )
        )
        ledger = await store(self.database_url, self.shape.seed, runs)
        verdict = check(
            ledger,
            faults,
            produced,
            session_s=self.shape.session_s,
            commit_interval_s=COMMIT_INTERVAL_S,
            in_flight=self.shape.members * self.shape.concurrency,
            stable=stable,
        )
        errors = [line for replica in self.replicas for line in replica.error_lines()]
        return Outcome(self.shape, verdict, faults, produced, stable, errors)

    async def _set_up(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Members reach the broker where it says it is: through the proxy, which can cut one
        # member's connections and not the others'.
        await self.broker_proxy.start()
        self.broker.advertised_port = self.broker_proxy.port
        self.bootstrap = await asyncio.to_thread(self.broker.start)
        host, port = self.bootstrap.rsplit(":", 1)
        self.broker_proxy.upstreams = [(host, int(port))]
        name = f"chaos_{self.shape.seed}_{uuid.uuid4().hex[:8]}"
        self.database_url = await asyncio.to_thread(self.postgres.create_database, name)
        await asyncio.to_thread(migrate.upgrade, self.database_url)
        async with ClusterMetadata(self.bootstrap, request_timeout_ms=10_000) as cluster:
            await cluster.create_topic(self.topic, self.shape.partitions)
        settings = coordinator_settings(
            self.database_url, self.bootstrap, session_timeout_ms=self.shape.session_ms
        )
        for index in range(self.shape.replicas):
            replica = CoordinatorProcess(
                settings, port=free_port(), log_path=self.directory / f"coordinator-{index}.log"
            )
            self.replicas.append(replica)
            await replica.start()
        self.balancer = await TcpProxy([("127.0.0.1", r.port) for r in self.replicas]).start()
        await allow_range_fetch(self.balancer.url, self.topic)
        for index in range(self.shape.members):
            name = f"m{index}"
            self.links[name] = await TcpProxy([("127.0.0.1", self.balancer.port)]).start()
            self.workers[name] = self._worker(name)
            await self.workers[name].start()

    def _worker(self, name: str) -> WorkerProcess:
        return WorkerProcess(
            bootstrap=self.bootstrap,
            coordinator=self.links[name].url,
            group=self.group,
            topic=self.topic,
            session_timeout_ms=self.shape.session_ms,
            options=[
                "--journal",
                str(self.journal(name)),
                "--name",
                name,
                "--work-ms",
                str(self.shape.work_ms),
                "--concurrency",
                str(self.shape.concurrency),
                "--block-ms",
                str(self.shape.block_s * 1000),
            ],
            log_path=self.directory / f"{name}.log",
        )

    async def _until_every_member_works(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(_has_lines(self.journal(name)) for name in self.workers):
            if time.monotonic() > deadline:
                raise AssertionError(f"not every member handled a record within {timeout_s} s")
            await asyncio.sleep(0.2)

    async def _inject(self, fault: Fault) -> FaultRecord:
        logger.info("fault %s", fault)
        started = time.monotonic()
        if fault.kind == kinds.MEMBER_KILL:
            await self.workers[fault.target].kill()
            await asyncio.sleep(fault.duration_s)
            self.workers[fault.target] = self._worker(fault.target)
            await self.workers[fault.target].start()
        elif fault.kind == kinds.MEMBER_FREEZE:
            self.workers[fault.target].send_signal(signal.SIGSTOP)
            await asyncio.sleep(fault.duration_s)
            self.workers[fault.target].send_signal(signal.SIGCONT)
        elif fault.kind == kinds.LOOP_BLOCK:
            self.workers[fault.target].send_signal(signal.SIGUSR1)
            await asyncio.sleep(fault.duration_s)
        elif fault.kind == kinds.COORDINATOR_KILL:
            replica = self.replicas[int(fault.target)]
            await replica.kill()
            await asyncio.sleep(fault.duration_s)
            await replica.start()
        elif fault.kind == kinds.POSTGRES_STOP:
            await asyncio.to_thread(self.postgres.stop)
            await asyncio.sleep(fault.duration_s)
            await asyncio.to_thread(self.postgres.start)
        elif fault.kind == kinds.COORDINATOR_LINK:
            self.links[fault.target].cut(fault.mode)
            await asyncio.sleep(fault.duration_s)
            self.links[fault.target].heal()
        elif fault.kind == kinds.BROKER_LINK:
            process = self.workers[fault.target].process
            assert process is not None
            self.broker_proxy.cut(fault.mode, only_pids=frozenset({process.pid}))
            await asyncio.sleep(fault.duration_s)
            self.broker_proxy.heal()
        else:
            raise ValueError(f"unknown fault kind {fault.kind}")
        # Killing the only replica cuts every member off, as a Postgres stop does.
        only_replica = fault.kind == kinds.COORDINATOR_KILL and len(self.replicas) == 1
        target = kinds.EVERYONE if only_replica else fault.target
        return FaultRecord(fault.kind, target, started, time.monotonic())

    async def _until_all_committed(
        self, produced: dict[int, int], timeout_s: float = 90
    ) -> dict[int, int]:
        """Once faults stop, the group's stable offset must reach each partition's end."""
        assert self.balancer is not None
        stable: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.balancer.url) as api:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    reply = await api.get(
                        f"/v1/admin/groups/{self.group}/offsets", params={"topic": self.topic}
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
            await worker.close(timeout_s=15)
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


def _with_actual_blocks(records: list[FaultRecord], blocks: list[Block]) -> list[FaultRecord]:
    """A blocked loop's fault lasts from when the handler blocked to when it returned, which
    the member's journal knows (the signal only asks the next handler to block)."""
    actual = []
    for record in records:
        if record.kind == kinds.LOOP_BLOCK:
            block = next(
                (b for b in blocks if b.process == record.target and b.ended >= record.started),
                None,
            )
            if block is not None:
                record = FaultRecord(record.kind, record.target, block.started, block.ended)
        actual.append(record)
    return actual


def _has_lines(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0
