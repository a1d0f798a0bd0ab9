"""Helpers for the streams tests: producing inputs, reading outputs, running apps in this
process or as `keyrange streams` processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from client.http import CoordinatorClient
from client.streams import INT64, STRING, Processor, StoreSpec, Topology
from client.streams.app import StreamsApp
from tests.fixtures.services import MakeTopic

ROOT = Path(__file__).resolve().parents[2]


async def produce(
    bootstrap: str, topic: str, records: Sequence[tuple[bytes | None, bytes | None, int | None]]
) -> None:
    """(key, value, timestamp ms) each, to partition 0 in this order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value, timestamp in records:
            await producer.send(topic, value=value, key=key, partition=0, timestamp_ms=timestamp)
        await producer.flush()
    finally:
        await producer.stop()


class TopicReader:
    """Reads a topic's partition 0 from the start, keeping every record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._tp = TopicPartition(topic, 0)
        self.records: list[Any] = []

    async def __aenter__(self) -> TopicReader:
        await self._consumer.start()
        self._consumer.assign([self._tp])
        self._consumer.seek(self._tp, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def poll(self) -> list[Any]:
        batch = await self._consumer.getmany(self._tp, timeout_ms=100)
        self.records.extend(batch.get(self._tp, ()))
        return self.records

    async def read_to_end(self) -> list[Any]:
        """Every record up to the high watermark a fetch reports (never ListOffsets, which
        the embedded broker answers wrongly)."""
        while True:
            await self.poll()
            highwater = self._consumer.highwater(self._tp)
            if highwater is not None and await self._consumer.position(self._tp) >= highwater:
                return self.records

    async def counted_at_least(self, truth: Mapping[str, int]) -> bool:
        """Read on; whether every key of ``truth``, and no other, has a latest count at
        least its truth (at-least-once: a crash's uncommitted records count again)."""
        await self.poll()
        latest = self.latest()
        return set(latest) == set(truth) and all(latest[word] >= truth[word] for word in truth)

    def latest(self) -> dict[str, Any]:
        """The last value per key, decoded as text keys and JSON-or-int64 values."""
        latest: dict[str, Any] = {}
        for record in self.records:
            latest[record.key.decode()] = decode(record.value)
        return latest


def decode(value: bytes | None) -> Any:
    if value is None:
        return None
    if len(value) == 8 and not value.startswith(b"{"):
        return int.from_bytes(value, "big", signed=True)
    return json.loads(value)


async def accept_range_fetch(coordinator: str, *topics: str) -> None:
    async with CoordinatorClient(coordinator) as client:
        for topic in topics:
            await client.set_accept_range_fetch(topic)


@contextlib.asynccontextmanager
async def running(app: StreamsApp) -> AsyncIterator[StreamsApp]:
    task = asyncio.create_task(app.run())
    try:
        yield app
    finally:
        app.stop()
        await asyncio.wait_for(task, 60)


class StreamsProcess:
    """One `keyrange streams` process with JSON logs collected from its stderr."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.logs: list[dict[str, Any]] = []
        self._reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            try:
                self.logs.append(json.loads(line))
            except ValueError:
                self.logs.append({"msg": line.decode(errors="replace").rstrip()})

    def restores(self) -> list[dict[str, Any]]:
        return [entry for entry in self.logs if entry.get("msg") == "store restored"]

    async def stop(self, sig: int) -> int:
        self.process.send_signal(sig)
        code = await asyncio.wait_for(self.process.wait(), 60)
        await self._reading
        return code


def streams_command(
    target: str, application_id: str, bootstrap: str, coordinator: str, state_dir: Path
) -> list[str]:
    """The `keyrange streams` command line the tests run, logging JSON."""
    return [
        sys.executable,
        "-m",
        "client.cli",
        "streams",
        target,
        "--application-id",
        application_id,
        "--bootstrap",
        bootstrap,
        "--coordinator",
        coordinator,
        "--state-dir",
        str(state_dir),
        "--session-timeout-ms",
        "3000",
        "--commit-interval-ms",
        "200",
        "--log-format",
        "json",
    ]


async def start_streams(
    target: str,
    application_id: str,
    bootstrap: str,
    coordinator: str,
    state_dir: Path,
    env: dict[str, str],
) -> StreamsProcess:
    process = await asyncio.create_subprocess_exec(
        *streams_command(target, application_id, bootstrap, coordinator, state_dir),
        cwd=ROOT,
        env={**os.environ, **env},
        stderr=asyncio.subprocess.PIPE,
    )
    return StreamsProcess(process)


async def group_members(coordinator: str, group_id: str) -> list[dict[str, Any]]:
    """Each live member as the coordinator describes it: ids, owned and target slices."""
    async with httpx.AsyncClient(base_url=coordinator) as api:
        reply = await api.get(f"/v1/admin/groups/{group_id}")
        if reply.status_code == 404:
            return []
        reply.raise_for_status()
        members: list[dict[str, Any]] = reply.json()["members"]
        return members


async def group_owners(coordinator: str, group_id: str) -> list[list[Any]]:
    """Each live member's owned slices, as the coordinator sees them."""
    return [member["owned"] for member in await group_members(coordinator, group_id)]


async def group_settled(
    coordinator: str, group_id: str, members: int, topics: Sequence[str] = ()
) -> bool:
    """Whether ``members`` live members each own their final share: something, and exactly
    what the assignor targets for them (no hand-off still under way), and ``topics`` (say,
    the internal topics an application creates as it starts) are owned too."""

    def pieces(slices: list[Any]) -> list[str]:
        return sorted(json.dumps(piece, sort_keys=True) for piece in slices)

    described = await group_members(coordinator, group_id)
    owned = {piece["topic"] for member in described for piece in member["owned"]}
    return (
        len(described) == members
        and all(
            member["owned"] and pieces(member["owned"]) == pieces(member["target"])
            for member in described
        )
        and owned.issuperset(topics)
    )


# ------------------------------------------------------------------ the word count

WORDS = [f"w{index}" for index in range(40)]
WORDCOUNT_TARGET = "examples.streams_wordcount:build_topology"
# `keyrange streams --instance-id`: the name the coordinator shows for the member.
INSTANCE_ID_ENV = "KEYRANGE_STREAMS_INSTANCE_ID"


def batch(start: int, count: int) -> list[tuple[bytes, bytes, None]]:
    """Lines of five words each, spread over the word list."""
    return [
        (
            b"line-%d" % index,
            " ".join(WORDS[(index * 7 + step) % len(WORDS)] for step in range(5)).encode(),
            None,
        )
        for index in range(start, start + count)
    ]


def truth_of(lines: list[tuple[bytes, bytes, None]]) -> Counter[str]:
    return Counter(word for _, text, _ in lines for word in text.decode().split())


class WordCountRun:
    """`keyrange streams` processes of examples/streams_wordcount.py in one application."""

    def __init__(
        self,
        spawned: list[StreamsProcess],
        bootstrap: str,
        coordinator: str,
        lines: str,
        words: str,
        counts: str,
    ) -> None:
        self.spawned = spawned
        self.bootstrap = bootstrap
        self.coordinator = coordinator
        self.app_id = f"wc-{lines}"
        self.env = {"WORDCOUNT_LINES": lines, "WORDCOUNT_WORDS": words, "WORDCOUNT_COUNTS": counts}
        self.lines = lines

    async def start(self, state: Path, instance_id: str | None = None) -> StreamsProcess:
        env = self.env if instance_id is None else {**self.env, INSTANCE_ID_ENV: instance_id}
        process = await start_streams(
            WORDCOUNT_TARGET, self.app_id, self.bootstrap, self.coordinator, state, env
        )
        self.spawned.append(process)
        return process

    async def settled(self, members: int) -> bool:
        owners = await group_owners(self.coordinator, self.app_id)
        return len(owners) == members and all(owners)


async def wordcount_topics(make_topic: MakeTopic, coordinator: str) -> tuple[str, str, str]:
    lines, words, counts = await make_topic(1), await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator, lines, words)
    return lines, words, counts


# ------------------------------------------------------------------ one count, one sub-topology

Hold = Callable[[str, int], None]


class Count(Processor):
    """Counts each key; ``hold`` (when given) runs between reading a count and writing it."""

    def __init__(self, hold: Hold | None = None) -> None:
        self._hold = hold

    def process(self, key: str, value: int) -> None:
        counts = self.context.state_store("counts")
        count = (counts.get(key) or 0) + value
        if self._hold is not None:
            self._hold(key, count)
        counts.put(key, count)
        self.context.forward(key, count)


def count_topology(words: str, counts: str, hold: Hold | None = None) -> Topology:
    """Words (INT64 increments) counted in the in-memory store ``counts``, each new count
    sent to ``counts``."""
    return (
        Topology()
        .add_source("words", words, key_serde=STRING, value_serde=INT64)
        .add_processor("count", lambda: Count(hold), "words")
        .add_state_store(StoreSpec("counts", STRING, INT64), "count")
        .add_sink("out", counts, "count", key_serde=STRING, value_serde=INT64)
    )


def increments(words: Sequence[str]) -> list[tuple[bytes, bytes, None]]:
    """One record adding 1 to each of ``words``, in order."""
    return [(word.encode(), (1).to_bytes(8, "big"), None) for word in words]
