"""Zombie members: a member frozen (SIGSTOP) or whose event loop is blocked for longer than its
session must hand out nothing after its session deadline, even though its keys went to another
member meanwhile and its heartbeat has not told it yet (docs/design.md §5, the client half).

Two members in processes of their own share one partition while records flow; one of them is
stalled for 2.5 session timeouts. Their ledgers (``worker_process.py --ledger``) are read on the
machine-wide monotonic clock. Each test runs several rounds, each on a fresh group and topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from tests.e2e.harness import allow_range_fetch, unique
from tests.e2e.processes import WorkerProcess
from tests.fixtures.services import MakeTopic
from tests.waiting import until

pytestmark = pytest.mark.slow

SESSION_TIMEOUT_MS = 2_000
STALL_S = 2.5 * SESSION_TIMEOUT_MS / 1000
ROUNDS = 3
KEYS = [b"key-%d" % index for index in range(200)]


@dataclass(frozen=True)
class Effect:
    member: str
    offset: int
    key: str
    started: float
    ended: float


class LedgerFile:
    """A worker's ledger, read back as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def events(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def effects(self) -> list[Effect]:
        return [
            Effect(event["m"], event["o"], event["k"], event["s"], event["t"])
            for event in self.events()
            if event["e"] == "effect"
        ]

    def starts(self) -> list[dict[str, Any]]:
        return [event for event in self.events() if event["e"] == "start"]


class Traffic:
    """Keyed records to partition 0 at a steady pace until stopped; counts what it sent."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.sent = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> int:
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.sent

    async def _run(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks=1, enable_idempotence=False, linger_ms=5
        )
        await producer.start()
        pick = random.Random(self.topic)
        try:
            while not self._stop.is_set():
                deliveries = [
                    await producer.send(self.topic, key=pick.choice(KEYS), value=b"", partition=0)
                    for _ in range(10)
                ]
                for delivery in deliveries:
                    await delivery
                self.sent += len(deliveries)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.05)
        finally:
            await producer.stop()


async def stable_offset(api: httpx.AsyncClient, group: str, topic: str) -> int:
    reply = await api.get(f"/v1/admin/groups/{group}/offsets", params={"topic": topic})
    if reply.status_code != 200:
        return 0
    for entry in reply.json()["partitions"]:
        if entry["partition"] == 0:
            return int(entry["stable_offset"])
    return 0


def overlaps(effects: list[Effect]) -> list[str]:
    """Two handlers that acted on one key while their runs overlapped in time."""
    per_key: dict[str, list[Effect]] = defaultdict(list)
    for effect in effects:
        per_key[effect.key].append(effect)
    problems = []
    for key, runs in per_key.items():
        runs.sort(key=lambda effect: effect.started)
        latest_end: Effect | None = None
        for effect in runs:
            if latest_end is not None and effect.started < latest_end.ended:
                problems.append(
                    f"key {key}: offset {effect.offset} on {effect.member} started while offset "
                    f"{latest_end.offset} ran on {latest_end.member}"
                )
            if latest_end is None or effect.ended > latest_end.ended:
                latest_end = effect
    return problems


@pytest.fixture
async def workers() -> AsyncIterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        await worker.close()


async def one_round(
    stall: str,
    *,
    coordinator: str,
    bootstrap: str,
    topic: str,
    directory: Path,
    workers: list[WorkerProcess],
) -> str:
    group = unique("stalled")
    await allow_range_fetch(coordinator, topic)
    ledgers = {name: LedgerFile(directory / f"{name}.jsonl") for name in ("a", "b")}
    processes = {
        name: WorkerProcess(
            bootstrap=bootstrap,
            coordinator=coordinator,
            group=group,
            topic=topic,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            options=[
                "--ledger",
                str(ledger.path),
                "--work-ms",
                "20",
                "--concurrency",
                "8",
                "--block-ms",
                str(STALL_S * 1000),
            ],
        )
        for name, ledger in ledgers.items()
    }
    workers.extend(processes.values())
    traffic = Traffic(bootstrap, topic)
    traffic.start()
    try:
        await processes["a"].start()
        await until(lambda: ledgers["a"].effects(), 60, "member a to process records")
        await processes["b"].start()
        b_joined = time.monotonic()
        # Both members busy on their halves of the partition, a's after b took its share.
        await until(
            lambda: (
                len(ledgers["b"].effects()) >= 20
                and any(effect.started > b_joined for effect in ledgers["a"].effects())
                and len({effect.member for effect in ledgers["a"].effects()}) == 1
            ),
            60,
            "both members to process their shares",
        )
        stalled_member = ledgers["a"].effects()[-1].member

        if stall == "frozen":
            processes["a"].send_signal(signal.SIGSTOP)
            await asyncio.sleep(STALL_S)  # the fault itself: frozen past its session
            resumed = time.monotonic()
            processes["a"].send_signal(signal.SIGCONT)
        else:
            processes["a"].send_signal(signal.SIGUSR1)
            await until(
                lambda: any(event["e"] == "blocked" for event in ledgers["a"].events()),
                60,
                "member a's handler to block its event loop and return",
            )
            resumed = next(event["t"] for event in ledgers["a"].events() if event["e"] == "blocked")

        await until(
            lambda: any(
                effect.member != stalled_member and effect.started > resumed
                for effect in ledgers["a"].effects()
            ),
            60,
            "member a to rejoin and process records again",
        )
    finally:
        sent = await traffic.stop()

    async with httpx.AsyncClient(base_url=coordinator) as api:

        async def all_committed() -> bool:
            return await stable_offset(api, group, topic) >= sent

        await until(all_committed, 60, f"the stable offset to reach {sent}")

    for process in processes.values():
        assert await process.close() == 0
    effects = ledgers["a"].effects() + ledgers["b"].effects()

    zombie_starts = [
        event
        for event in ledgers["a"].starts()
        if event["m"] == stalled_member and event["t"] > resumed
    ]
    assert zombie_starts == [], (
        f"{len(zombie_starts)} records handed out by the stalled member after its session "
        f"deadline: {zombie_starts[:5]}"
    )
    assert overlaps(effects) == []
    done = {effect.offset for effect in effects}
    assert [offset for offset in range(sent) if offset not in done] == []
    return (
        f"{stall}: {sent} records, a {len(ledgers['a'].effects())} effects, "
        f"b {len(ledgers['b'].effects())}"
    )


@pytest.mark.parametrize("stall", ["frozen", "blocked"])
async def test_a_member_stalled_past_its_session_hands_out_nothing_after_its_deadline(
    stall: str,
    coordinator: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    for round_number in range(ROUNDS):
        directory = tmp_path / f"round-{round_number}"
        directory.mkdir()
        summary = await one_round(
            stall,
            coordinator=coordinator,
            bootstrap=kafka_bootstrap,
            topic=await make_topic(1),
            directory=directory,
            workers=workers,
        )
        print(f"\nround {round_number}: {summary}")
