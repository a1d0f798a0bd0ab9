"""End-to-end harness: cooperative members on one partition, a ledger of what they processed,
and observers of the coordinator's stored state.

Members run as tasks in the test's event loop (so the ledger sees every handler start and end
on one clock) unless a test needs a real process to kill (``worker_process.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiokafka import AIOKafkaProducer

from client import CoordinatorClient, KeyRange, KeyrangeConsumer, RebalanceListener, key_hash
from client.http import Slices
from client.protocol.keyspace import intersect, normalize

SESSION_TIMEOUT_MS = 2_000


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def zipf_keys(records: int, distinct: int, *, seed: int) -> list[bytes]:
    """Skewed keys, Zipf(1) over ``distinct`` keys: the hottest gets about 1/ln(distinct)."""
    weights = [1.0 / rank for rank in range(1, distinct + 1)]
    names = [b"key-%d" % rank for rank in range(distinct)]
    return random.Random(seed).choices(names, weights=weights, k=records)


async def produce(bootstrap: str, topic: str, keys: Sequence[bytes]) -> None:
    """One record per key to partition 0, value = its index (so the offset is checkable)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, enable_idempotence=False, linger_ms=5
    )
    await producer.start()
    try:
        deliveries = [
            await producer.send(topic, key=key, value=b"%d" % index, partition=0)
            for index, key in enumerate(keys)
        ]
        await producer.flush()
        for delivery in deliveries:
            await delivery
    finally:
        await producer.stop()


async def allow_range_fetch(coordinator: str, topic: str) -> None:
    async with httpx.AsyncClient(base_url=coordinator) as api:
        reply = await api.put(f"/v1/admin/topics/{topic}/config", json={"accept_range_fetch": True})
        reply.raise_for_status()


@dataclass(frozen=True)
class Handled:
    member: str
    offset: int
    key: bytes
    started: float
    ended: float


@dataclass
class Ledger:
    """Every record a member's handler finished, with when it ran."""

    keys: Sequence[bytes]
    handled: list[Handled] = field(default_factory=list)

    def by_offset(self) -> dict[int, list[Handled]]:
        seen: dict[int, list[Handled]] = defaultdict(list)
        for entry in self.handled:
            seen[entry.offset].append(entry)
        return seen

    def processed(self) -> set[int]:
        return {entry.offset for entry in self.handled}

    def missing(self) -> list[int]:
        done = self.processed()
        return [offset for offset in range(len(self.keys)) if offset not in done]

    def duplicates(self) -> dict[int, list[Handled]]:
        return {offset: runs for offset, runs in self.by_offset().items() if len(runs) > 1}

    def unexplained_duplicates(self, lost_at: dict[str, list[float]]) -> dict[int, list[str]]:
        """Records processed more than once although whoever processed them first never
        lost its slices afterwards (a clean hand-off commits before it releases)."""
        unexplained: dict[int, list[str]] = {}
        for offset, runs in self.duplicates().items():
            first = min(runs, key=lambda entry: entry.started)
            if not any(lost > first.ended for lost in lost_at.get(first.member, [])):
                unexplained[offset] = [entry.member for entry in runs]
        return unexplained

    def order_violations(self) -> list[str]:
        """Per key: no two handlers at once (whichever members ran them), and each record
        first processed only after every earlier record of its key was processed once."""
        problems: list[str] = []
        per_key: dict[bytes, list[Handled]] = defaultdict(list)
        for entry in self.handled:
            per_key[entry.key].append(entry)
        for key, runs in per_key.items():
            runs.sort(key=lambda entry: entry.started)
            for before, after in itertools.pairwise(runs):
                if after.started < before.ended:
                    problems.append(
                        f"{key!r}: offset {after.offset} on {after.member} started while "
                        f"offset {before.offset} ran on {before.member}"
                    )
            highest = -1
            first_seen: set[int] = set()
            for entry in runs:
                if entry.offset in first_seen:
                    continue
                first_seen.add(entry.offset)
                if entry.offset < highest:
                    problems.append(f"{key!r}: offset {entry.offset} first ran after {highest}")
                highest = max(highest, entry.offset)
        return problems


class SeverableTransport(httpx.AsyncHTTPTransport):
    """A member's link to the coordinator that can be cut, as if its process had died: from
    then on nothing it sends reaches the coordinator."""

    def __init__(self) -> None:
        super().__init__()
        self.severed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.severed:
            raise httpx.ConnectError("severed", request=request)
        return await super().handle_async_request(request)


class _LossRecorder(RebalanceListener):
    def __init__(self, lost_at: list[float]) -> None:
        self.lost_at = lost_at

    async def on_slices_lost(self, slices: Slices) -> None:
        self.lost_at.append(time.monotonic())


class Member:
    """One cooperative member in the test's event loop, processing with ``run()``."""

    def __init__(
        self,
        name: str,
        ledger: Ledger,
        *,
        bootstrap: str,
        coordinator: str,
        group: str,
        topic: str,
        work_s: float,
        concurrency: int = 4,
    ) -> None:
        """``concurrency`` 0 processes with ``async for`` (strictly in offset order), else
        with ``run(max_concurrency=concurrency)`` (per-key order, keys concurrently)."""
        self.name = name
        self.ledger = ledger
        self.work_s = work_s
        self.concurrency = concurrency
        self.transport = SeverableTransport()
        # When it lost slices without committing (membership lost): at-least-once delivery
        # then hands what it processed since its last commit to the slices' next owner.
        self.lost_at: list[float] = []
        self.consumer = KeyrangeConsumer(
            topic,
            bootstrap_servers=bootstrap,
            coordinator_url=coordinator,
            group_id=group,
            client_id=name,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            auto_commit_interval_ms=200,
            coordinator=CoordinatorClient(coordinator, transport=self.transport),
            revoke_timeout_s=10,
            rebalance_listener=_LossRecorder(self.lost_at),
        )
        self.task: asyncio.Task[None] | None = None
        self.outside_assignment: list[int] = []

    async def start(self) -> Member:
        await self.consumer.start()
        if self.concurrency:
            processing = self.consumer.run(self.handle, max_concurrency=self.concurrency)
        else:
            processing = self._in_order()
        self.task = asyncio.create_task(processing, name=self.name)
        return self

    async def _in_order(self) -> None:
        async for record in self.consumer:
            await self.handle(record)

    async def handle(self, record: Any) -> None:
        started = time.monotonic()
        hashed = key_hash(record.key, record.offset)
        owned = self.consumer.assignment()
        if not any(keys.contains(hashed) for keys in next(iter(owned.values()), [])):
            self.outside_assignment.append(record.offset)
        await asyncio.sleep(self.work_s)
        self.ledger.handled.append(
            Handled(self.name, record.offset, record.key, started, time.monotonic())
        )

    async def leave(self) -> None:
        """A clean stop: in-flight records finish, progress is committed, the member leaves."""
        await self.consumer.stop()
        if self.task is not None:
            await self.task

    async def crash(self) -> None:
        """Die mid-stream: processing cancelled, nothing committed, no goodbye."""
        self.transport.severed = True
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.consumer.stop(), 20)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.task is not None:
            with contextlib.suppress(BaseException):
                await self.task


@dataclass
class StateObserver:
    """Polls the coordinator's admin API while a test runs: the peak stored IC state of
    partition 0, and any instant where two members' slices overlap."""

    coordinator: str
    group: str
    topic: str
    peak_ic_ranges: int = 0
    peak_watermarks: int = 0
    stable_offset: int = 0
    overlaps: list[str] = field(default_factory=list)
    partial_holdings: list[str] = field(default_factory=list)
    max_holders: int = 0
    polls: int = 0

    async def run(self, interval_s: float = 0.1) -> None:
        async with httpx.AsyncClient(base_url=self.coordinator) as api:
            while True:
                await self.poll(api)
                await asyncio.sleep(interval_s)

    async def poll(self, api: httpx.AsyncClient) -> None:
        offsets = await api.get(
            f"/v1/admin/groups/{self.group}/offsets", params={"topic": self.topic}
        )
        if offsets.status_code == 200:
            for entry in offsets.json()["partitions"]:
                if entry["partition"] == 0:
                    self.peak_ic_ranges = max(self.peak_ic_ranges, len(entry["ranges"]))
                    self.peak_watermarks = max(self.peak_watermarks, len(entry["watermarks"]))
                    self.stable_offset = entry["stable_offset"]
        described = await api.get(f"/v1/admin/groups/{self.group}")
        if described.status_code == 200:
            self.check_disjoint(described.json()["members"])
        self.polls += 1

    def check_disjoint(self, members: list[dict[str, Any]]) -> None:
        held: dict[str, list[KeyRange]] = {}
        for member in members:
            ranges = [
                KeyRange.from_json(pair)
                for kind in ("owned", "assigned")
                for piece in member[kind]
                if piece["topic"] == self.topic and piece["partition"] == 0
                for pair in piece["ranges"]
            ]
            held[member["member_id"]] = normalize(ranges)
            if ranges and held[member["member_id"]] != [KeyRange.full()]:
                self.partial_holdings.append(f"{member['member_id']} holds {ranges}")
        self.max_holders = max(self.max_holders, sum(1 for ranges in held.values() if ranges))
        names = sorted(held)
        for index, first in enumerate(names):
            for second in names[index + 1 :]:
                shared = intersect(held[first], held[second])
                if shared:
                    self.overlaps.append(f"{first} and {second} both hold {shared}")
