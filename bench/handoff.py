"""Hand-off latency: how soon a join and a leave take effect, with the coordinator's default
settings (3 s heartbeat interval, 10 s sessions).

A group of ``--members`` (8) shares one partition that accepts range fetch while a producer
writes ``--rate`` (400) keyed records a second. Seven members stay; the eighth joins and
leaves ``--rounds`` (30) times, each time once the group is stable again. Measured per round:

- ``join``: from the newcomer's ``start()`` to its handler's first record;
- ``leave``: from the newcomer's leave (``stop()`` has finished its records and committed;
  its ``on_slices_revoked`` runs just before the leave is sent) to the first record of the
  key ranges it owned handled by one of the others (the heir);
- ``stop``: the same from the moment ``stop()`` is called, which adds the leaver's own
  drain and final commit.

Baseline, in the same run: the same rounds (``--baseline-rounds``, 6: each costs seconds)
against a coordinator with prompt hand-offs off (``KEYRANGE_PROMPT_HANDOFF=false``), where a
member hears of a change only at its next heartbeat. Goal: ``join_p99_s`` and ``leave_p99_s``
at most 0.5 s.

Everything runs on this machine: embedded Postgres and broker, the coordinator as its own
process, the members in this process. Prints one line per phase, then one JSON object on the
last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from bench.commit import free_port
from client import KeyRange, KeyrangeConsumer, RebalanceListener, key_hash
from client.http import Slices
from coordinator.kafka import ClusterMetadata
from examples.demo_stack import Stack, allow_range_fetch

GOAL_P99_S = 0.5
DISTINCT_KEYS = 1_000
WORK_S = 0.001
STABLE_TIMEOUT_S = 60.0
FIRST_RECORD_TIMEOUT_S = 30.0


def log(message: str) -> None:
    print(message, flush=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


@dataclass
class Watch:
    """The first record a set of members handles from given key ranges after a given time."""

    since: float = 0.0
    ranges: list[KeyRange] = field(default_factory=list)
    seen: asyncio.Event = field(default_factory=asyncio.Event)
    at: float = 0.0

    def arm(self, ranges: list[KeyRange]) -> None:
        self.since, self.ranges, self.at = time.monotonic(), ranges, 0.0
        self.seen.clear()

    def offer(self, hashed: int) -> None:
        if self.seen.is_set() or not self.ranges:
            return
        if any(keys.start <= hashed <= keys.end for keys in self.ranges):
            self.at = time.monotonic()
            self.seen.set()

    async def latency(self) -> float:
        await asyncio.wait_for(self.seen.wait(), FIRST_RECORD_TIMEOUT_S)
        return self.at - self.since


class LeaveClock(RebalanceListener):
    """When the member is about to leave: ``stop()`` reports its slices revoked once it has
    finished and committed them, just before the leave is sent."""

    def __init__(self) -> None:
        self.at = 0.0

    async def on_slices_revoked(self, slices: Slices) -> None:
        self.at = time.monotonic()


class Member:
    def __init__(self, options: dict[str, Any], topic: str, heirs: Watch | None) -> None:
        self.leave_clock = LeaveClock()
        self.consumer = KeyrangeConsumer(topic, rebalance_listener=self.leave_clock, **options)
        self.heirs = heirs
        self.first = Watch()
        self._runner: asyncio.Task[None] | None = None

    async def handle(self, record: ConsumerRecord[bytes, bytes]) -> None:
        hashed = key_hash(record.key, record.offset)
        self.first.offer(hashed)
        if self.heirs is not None:
            self.heirs.offer(hashed)
        await asyncio.sleep(WORK_S)

    async def start(self) -> None:
        await self.consumer.start()
        self._runner = asyncio.create_task(self.consumer.run(self.handle, max_concurrency=16))

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        await self.consumer.stop()


async def keep_producing(bootstrap: str, topic: str, rate: float) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        index = 0
        started = time.monotonic()
        while True:
            await producer.send(topic, key=b"key-%d" % (index % DISTINCT_KEYS), value=b"v")
            index += 1
            ahead = index / rate - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
    finally:
        await producer.stop()


async def until_stable(api: httpx.AsyncClient, group_id: str, members: int) -> None:
    deadline = time.monotonic() + STABLE_TIMEOUT_S
    while time.monotonic() < deadline:
        reply = await api.get(f"/v1/admin/groups/{group_id}")
        if reply.status_code == 200:
            group = reply.json()
            if group["state"] == "stable" and len(group["members"]) == members:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"group {group_id} was not stable with {members} members in time")


async def rounds(stack: Stack, args: argparse.Namespace, count: int) -> dict[str, list[float]]:
    topic = f"handoff-{uuid.uuid4().hex[:8]}"
    async with ClusterMetadata(stack.bootstrap) as cluster:
        await cluster.create_topic(topic, 1)
    await allow_range_fetch(stack.coordinator_url, topic)
    group_id = f"handoff-{uuid.uuid4().hex[:8]}"
    options = {
        "bootstrap_servers": stack.bootstrap,
        "coordinator_url": stack.coordinator_url,
        "group_id": group_id,
    }
    heirs = Watch()
    producing = asyncio.create_task(keep_producing(stack.bootstrap, topic, args.rate))
    stayers = [Member(options, topic, heirs) for _ in range(args.members - 1)]
    joins: list[float] = []
    leaves: list[float] = []
    stops: list[float] = []
    try:
        for member in stayers:
            await member.start()
        async with httpx.AsyncClient(base_url=stack.coordinator_url, timeout=10) as api:
            await until_stable(api, group_id, len(stayers))
            for _ in range(count):
                newcomer = Member(options, topic, None)
                newcomer.first.arm([KeyRange.full()])
                await newcomer.start()
                joins.append(await newcomer.first.latency())
                await until_stable(api, group_id, args.members)
                owned = [
                    keys for ranges in newcomer.consumer.assignment().values() for keys in ranges
                ]
                heirs.arm(owned)
                await newcomer.stop()
                stops.append(await heirs.latency())
                leaves.append(heirs.at - newcomer.leave_clock.at)
                await until_stable(api, group_id, len(stayers))
    finally:
        producing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producing
        for member in stayers:
            await member.stop()
    return {"join": joins, "leave": leaves, "stop": stops}


def summarize(prefix: str, measured: dict[str, list[float]]) -> dict[str, float]:
    summary: dict[str, float] = {}
    for kind, values in measured.items():
        summary[f"{prefix}{kind}_p50_s"] = round(statistics.median(values), 3)
        summary[f"{prefix}{kind}_p99_s"] = round(percentile(values, 0.99), 3)
    return summary


def phase(work_dir: Path, args: argparse.Namespace, prompt: bool, count: int) -> dict[str, Any]:
    settings = {"prompt_handoff": "true" if prompt else "false", "log_format": "text"}
    stack = Stack(
        work_dir / ("prompt" if prompt else "baseline"),
        database="bench_handoff",
        port=free_port(),
        coordinator_settings=settings,
    )
    with stack:
        measured = asyncio.run(rounds(stack, args, count))
    summary = summarize("" if prompt else "baseline_", measured)
    log(f"{'prompt hand-offs' if prompt else 'baseline (prompt hand-offs off)'}: {summary}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--rate", type=float, default=400.0, help="records a second")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--baseline-rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keyrange-bench-handoff-") as work:
        summary: dict[str, Any] = {"members": args.members, "rounds": args.rounds}
        summary.update(phase(Path(work), args, prompt=True, count=args.rounds))
        summary.update(phase(Path(work), args, prompt=False, count=args.baseline_rounds))
    for kind in ("join", "leave"):
        summary[f"{kind}_p99_over_baseline"] = round(
            summary[f"{kind}_p99_s"] / summary[f"baseline_{kind}_p99_s"], 3
        )
        summary[f"{kind}_goal_met"] = summary[f"{kind}_p99_s"] <= GOAL_P99_S
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
