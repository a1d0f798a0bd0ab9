"""The streams benchmark's failover phase (issue 30): how much a standby key range shortens
an instance's failover.

Two `keyrange streams` instances of the word count (``examples.streams_wordcount``, a RocksDB
store) share one partition; ``--failover-keys`` (200,000) distinct words are counted once each,
so the store holds that many keys and its changelog as many records. One instance is killed
(SIGKILL) and one of its words is sent again: the time from the kill to that word's new count
in the output is the failover. ``failover_ratio`` is that time with ``num_standby_replicas=1``
over the time without (goal <= 0.25). Both include the session timeout
(``--failover-session-ms``, 3,000 by default as in the streams tests: a killed instance says
nothing, its session has to expire; 1,000, the coordinator's least, lost sessions on a loaded
machine) and the survivor's rebalance, the same with or
without a standby; ``failover_restore_ratio`` compares the part after the coordinator gave
the survivor the range (seen by polling the group's description every 20 ms), which is where
the standby acts: the survivor restores only the changelog's tail instead of the range from
offset 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from client.protocol.keyspace import KeyRange, key_hash
from examples.demo_stack import Stack
from tests.streams.harness import (
    ROOT,
    StreamsProcess,
    TopicReader,
    group_members,
    group_settled,
    streams_command,
)

TARGET = "examples.streams_wordcount:build_topology"
NewTopics = Callable[..., Awaitable[list[str]]]
_POLL_S = 0.02


async def _start(
    app_id: str, stack: Stack, state: Path, env: dict[str, str], session_ms: int
) -> StreamsProcess:
    command = streams_command(TARGET, app_id, stack.bootstrap, stack.coordinator_url, state)
    command[command.index("--session-timeout-ms") + 1] = str(session_ms)
    process = await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, env={**os.environ, **env}, stderr=asyncio.subprocess.PIPE
    )
    return StreamsProcess(process)


async def _produce_once(bootstrap: str, topic: str, keys: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        one = (1).to_bytes(8, "big", signed=True)
        for first in range(0, len(keys), 5_000):
            deliveries = [
                await producer.send(topic, key=key, value=one, partition=0)
                for key in keys[first : first + 5_000]
            ]
            await asyncio.gather(*deliveries)
    finally:
        await producer.stop()


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"failover bench: timed out waiting for {what}")
        await asyncio.sleep(_POLL_S)


def _ranges(member: dict[str, Any], topic: str) -> list[KeyRange]:
    return [
        KeyRange.from_json(pair)
        for piece in member["owned"]
        if piece["topic"] == topic
        for pair in piece["ranges"]
    ]


def _checkpoint(state: Path) -> list[tuple[KeyRange, int]]:
    path = state / "counts" / "partition-0" / "checkpoint"  # state_dir / app id is ``state``
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [(KeyRange.from_json(entry["keys"]), int(entry["offset"])) for entry in document]


async def failover_seconds(
    stack: Stack, standbys: int, keys: int, session_ms: int, work: Path, new_topics: NewTopics
) -> tuple[float, float, dict[str, Any]]:
    """(kill to processed, assigned to processed, the survivor's take-over restore)."""
    lines, words, counts = await new_topics(stack, "lines", "words", "counts")
    env = {
        "WORDCOUNT_LINES": lines,
        "WORDCOUNT_WORDS": words,
        "WORDCOUNT_COUNTS": counts,
        "KEYRANGE_STREAMS_LOG_LEVEL": "INFO",
        "KEYRANGE_STREAMS_NUM_STANDBY_REPLICAS": str(standbys),
    }
    app_id = f"bench-failover-{words}"
    states = [work / f"{app_id}-{index}" for index in range(2)]
    processes: list[StreamsProcess] = [
        await _start(
            app_id,
            stack,
            state,
            {**env, "KEYRANGE_STREAMS_INSTANCE_ID": f"instance-{index}"},
            session_ms,
        )
        for index, state in enumerate(states)
    ]
    try:
        await _until(lambda: group_settled(stack.coordinator_url, app_id, 2), 120, "two owners")
        words_sent = [b"word-%d" % index for index in range(keys)]
        async with TopicReader(stack.bootstrap, counts) as reader:
            await _produce_once(stack.bootstrap, words, words_sent)

            async def counted() -> bool:
                return len(await reader.poll()) >= keys

            await _until(counted, 600, f"{keys} words counted")
            members = await group_members(stack.coordinator_url, app_id)
            by_instance = {member["instance_id"]: _ranges(member, words) for member in members}
            victim, survivor = processes
            victim_ranges = by_instance["instance-0"]
            survivor_state = states[1] / app_id
            if standbys:

                async def warm() -> bool:
                    held = _checkpoint(survivor_state)
                    return all(
                        any(
                            offset >= keys and keys_range.overlaps(own)
                            for keys_range, offset in held
                        )
                        for own in victim_ranges
                    )

                await _until(warm, 120, "the survivor's standby at the changelog's end")
            probe = next(
                word
                for word in words_sent
                if any(own.contains(key_hash(word, 0)) for own in victim_ranges)
            )
            restores_before = len(survivor.restores())
            seen = len(reader.records)
            killed = time.monotonic()
            victim.process.kill()
            await victim.process.wait()
            await _produce_once(stack.bootstrap, words, [probe])

            async def reassigned() -> bool:
                described = await group_members(stack.coordinator_url, app_id)
                return len(described) == 1 and any(
                    keys_range.overlaps(own)
                    for keys_range in _ranges(described[0], words)
                    for own in victim_ranges
                )

            await _until(reassigned, 120, "the victim's range given to the survivor")
            assigned = time.monotonic()

            async def processed() -> bool:
                await reader.poll()
                return any(
                    record.key == probe and int.from_bytes(record.value, "big") == 2
                    for record in reader.records[seen:]
                )

            await _until(processed, 120, "the victim's key processed again")
            done = time.monotonic()
        taken = [entry for entry in survivor.restores()[restores_before:]]
        print(f"survivor's restores after the kill: {taken}", file=sys.stderr, flush=True)
        restored = sum(int(entry["records_restored"]) for entry in taken)
        read = sum(int(entry["records_read"]) for entry in taken)
        return done - killed, done - assigned, {"read": read, "restored": restored}
    finally:
        for process in processes:
            if process.process.returncode is None:
                await process.stop(signal.SIGTERM)


async def failover_ratio(
    stack: Stack, args: argparse.Namespace, work: Path, new_topics: NewTopics
) -> dict[str, Any]:
    measured: dict[int, list[tuple[float, float, dict[str, Any]]]] = {0: [], 1: []}
    for _ in range(args.failover_rounds):
        for standbys in (0, 1):
            measured[standbys].append(
                await failover_seconds(
                    stack, standbys, args.failover_keys, args.failover_session_ms, work, new_topics
                )
            )
    total = {n: statistics.median(run[0] for run in measured[n]) for n in measured}
    after = {n: statistics.median(run[1] for run in measured[n]) for n in measured}
    return {
        "failover_keys": args.failover_keys,
        "failover_session_ms": args.failover_session_ms,
        "failover_without_s": round(total[0], 3),
        "failover_with_standby_s": round(total[1], 3),
        "failover_ratio": round(total[1] / total[0], 3),
        "failover_restore_ratio": round(after[1] / after[0], 3),
        "failover_after_assign_without_s": round(after[0], 3),
        "failover_after_assign_with_standby_s": round(after[1], 3),
        "failover_records_read_without": measured[0][0][2]["read"],
        "failover_records_read_with_standby": measured[1][0][2]["read"],
        "failover_records_restored_without": measured[0][0][2]["restored"],
        "failover_records_restored_with_standby": measured[1][0][2]["restored"],
    }
