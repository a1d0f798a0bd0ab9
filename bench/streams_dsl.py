"""The streams DSL's phases of ``make bench-streams`` (issue 30).

``dsl_overhead``: the DSL word count (``examples.streams_dsl_wordcount``) against the
hand-written processors (``examples.streams_wordcount``), both fed the same ``--dsl-lines``
lines (5 words each) on one instance with no simulated I/O, so the difference is the DSL's
own cost (its extra re-keying node); the ratio is of median times over ``--dsl-rounds``
alternating runs (goal <= 1.15). Each run ends once every word's latest count reached the
reference: with the record cache on (the default) the DSL's count forwards the last count per
word per commit, not one per word, and ``dsl_records_out`` / ``processor_records_out`` say
how many records each sent downstream (what the cache changes for a DSL table's readers).

``windowed_speedup_4``: the page-views example (1-minute tumbling windows, final results)
with ``--lookup-ms`` of simulated I/O per view, ``--windowed-records`` views of
``--windowed-users`` users on ONE partition, run by 1 and by 4 instances (goal >= 3). The clock
runs from the first view produced to the last final window out (records far in the future
close every window). The four instances' run ends with the one holding the most views, so
``windowed_largest_share`` (its share of them, read from the settled group's ownership and the
views' key hashes) bounds the speed-up at its inverse before any other cost: each instance owns
a quarter of the hash space, and how many of the users hash into each quarter is chance
(bench/history/2026-11-27-issue-30-round-5-windowed-bound.md).
``windowed_cpu_us_1`` / ``_4``: the streams processes' CPU time over the same interval per
view (all instances together), a figure other load on the machine moves far less than the
speed-up: four instances share two cores with the broker and the coordinator.

Every clock starts once the group has settled: each instance owns its final share.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaProducer

from client.protocol.keyspace import key_hash
from examples.demo_stack import Stack
from tests.streams.harness import (
    StreamsProcess,
    TopicReader,
    group_members,
    group_settled,
    start_streams,
)

WORDS = [f"word{index}" for index in range(500)]
CLOSERS = [f"zz{index}" for index in range(64)]
MINUTE_MS = 60_000


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, int]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for key, value, stamp in records:
            await producer.send(topic, key=key, value=value, partition=0, timestamp_ms=stamp)
        await producer.flush()
    finally:
        await producer.stop()


async def _timed(
    stack: Stack,
    target: str,
    app_id: str,
    instances: int,
    env: dict[str, str],
    work: Path,
    feed: Callable[[], Any],
    output: str,
    done: Callable[[list[Any]], bool],
    topics: tuple[str, ...] = (),
    shares: list[list[tuple[int, int]]] | None = None,
) -> tuple[float, float]:
    """Start ``instances`` processes, wait until the group settled (``topics`` owned too),
    then time ``feed`` to ``done(output records)``: the seconds, and the CPU seconds the
    processes spent meanwhile (together). ``shares``, when given, receives each member's
    owned hash ranges (of the settled group) as ``[(start, end), ...]`` lists."""
    processes: list[StreamsProcess] = []
    env = {**env, "KEYRANGE_STREAMS_LOG_LEVEL": "WARNING"}
    for index in range(instances):
        processes.append(
            await start_streams(
                target,
                app_id,
                stack.bootstrap,
                stack.coordinator_url,
                work / f"{app_id}-{index}",
                env,
            )
        )
    try:
        deadline = time.monotonic() + 120
        while not await group_settled(stack.coordinator_url, app_id, instances, topics):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{instances} instances of {target} did not settle")
            await asyncio.sleep(0.2)
        if shares is not None:
            shares.extend(
                [(keys[0], keys[1]) for piece in member["owned"] for keys in piece["ranges"]]
                for member in await group_members(stack.coordinator_url, app_id)
            )
        running = [psutil.Process(process.process.pid) for process in processes]

        def cpu_seconds() -> float:
            return sum(sum(process.cpu_times()[:2]) for process in running)

        async with TopicReader(stack.bootstrap, output) as reader:
            started, cpu_before = time.monotonic(), cpu_seconds()
            await feed()
            while not done(await reader.poll()):
                if time.monotonic() - started > 600:
                    raise RuntimeError(f"{target} did not finish")
            return time.monotonic() - started, cpu_seconds() - cpu_before
    finally:
        for process in processes:
            await process.stop(signal.SIGTERM)


async def dsl_overhead(
    stack: Stack, args: argparse.Namespace, work: Path, new_topics: Any
) -> dict[str, Any]:
    lines = [
        (b"%d" % index, " ".join(WORDS[(index * 7 + step) % 500] for step in range(5)).encode(), 0)
        for index in range(args.dsl_lines)
    ]
    expected = 5 * len(lines)
    truth = Counter(word for _, line, _ in lines for word in line.decode().split())
    times: dict[str, list[float]] = {"dsl": [], "processor": []}
    # Records out per run: the processors forward every count, the DSL's count with the
    # record cache on (the default) the last per word per commit (docs/streams.md).
    out: dict[str, list[int]] = {"dsl": [], "processor": []}
    for _ in range(args.dsl_rounds):
        for kind in ("processor", "dsl"):
            source, words, counts = await new_topics(stack, "lines", "words", "counts")
            env = {
                "WORDCOUNT_LINES": source,
                "WORDCOUNT_WORDS": words,
                "WORDCOUNT_COUNTS": counts,
            }
            target = (
                "examples.streams_dsl_wordcount:build_topology"
                if kind == "dsl"
                else "examples.streams_wordcount:build_topology"
            )

            async def feed(topic: str = source) -> None:
                await _produce(stack.bootstrap, topic, lines)

            seen: list[Any] = []
            app_id = f"bench-{kind}-{source}"
            # The DSL's repartition topic is created as the app starts: owned before timing.
            internal = (f"{app_id}-words-repartition",) if kind == "dsl" else (words,)
            seconds, _ = await _timed(
                stack,
                target,
                app_id,
                1,
                env,
                work,
                feed,
                counts,
                functools.partial(_counted, truth=truth, seen=seen),
                internal,
            )
            times[kind].append(seconds)
            out[kind].append(len(seen))
            log(f"word count ({kind}): {expected / seconds:.0f} words/s")
    dsl, processor = statistics.median(times["dsl"]), statistics.median(times["processor"])
    return {
        "dsl_words": expected,
        "dsl_rate": round(expected / dsl, 1),
        "processor_rate": round(expected / processor, 1),
        "dsl_overhead": round(dsl / processor, 3),
        "dsl_records_out": statistics.median(out["dsl"]),
        "processor_records_out": statistics.median(out["processor"]),
    }


def _counted(records: list[Any], truth: Counter[str], seen: list[Any]) -> bool:
    """Whether the latest count of every word reached the reference (not a record per
    word: with the record cache a DSL count forwards fewer); ``seen`` keeps the records."""
    seen[:] = records
    latest: dict[str, int] = {}
    for record in records:
        latest[record.key.decode()] = int.from_bytes(record.value, "big", signed=True)
    return all(latest.get(word, 0) >= count for word, count in truth.items())


async def windowed_speedup(
    stack: Stack, args: argparse.Namespace, work: Path, new_topics: Any
) -> dict[str, Any]:
    count = args.windowed_records
    users = [f"user{index}" for index in range(args.windowed_users)]
    # Spread over ten minutes of event time.
    step = 10 * MINUTE_MS // count
    # Event time starts at this minute, as live records would (a broker's time-based
    # retention may drop records stamped in 1970).
    base = int(time.time() * 1000) // MINUTE_MS * MINUTE_MS
    views = [
        (users[(index * 7) % len(users)].encode(), b"{}", base + index * step)
        for index in range(count)
    ]
    end = base + count * step + 10 * MINUTE_MS
    closers = [(key.encode(), b"{}", end) for key in CLOSERS]
    windows = {(key, stamp // MINUTE_MS) for key, _, stamp in views}
    seconds: dict[int, float] = {}
    cpu: dict[int, float] = {}
    owned: list[list[tuple[int, int]]] = []
    for instances in (1, 4):
        source, output = await new_topics(stack, "views", "windows")
        env = {
            "PAGEVIEWS_INPUT": source,
            "PAGEVIEWS_OUTPUT": output,
            "PAGEVIEWS_LOOKUP_MS": str(args.lookup_ms),
        }

        async def feed(topic: str = source) -> None:
            await _produce(stack.bootstrap, topic, views + closers)

        seconds[instances], cpu[instances] = await _timed(
            stack,
            "examples.streams_dsl_pageviews:build_topology",
            f"bench-pv-{source}",
            instances,
            env,
            work,
            feed,
            output,
            lambda records: len(records) >= len(windows),
            shares=owned if instances == 4 else None,
        )
        log(f"page views, {instances} instance(s): {count / seconds[instances]:.0f} views/s")
    hashes = [key_hash(key, 0) for key, _, _ in views]
    largest = max(
        sum(1 for hashed in hashes if any(start <= hashed <= end for start, end in ranges))
        for ranges in owned
    )
    return {
        "windowed_records": count,
        "windowed_users": len(users),
        "windowed_largest_share": round(largest / count, 4),
        "windowed_rate_1": round(count / seconds[1], 1),
        "windowed_speedup_4": round(seconds[1] / seconds[4], 2),
        "windowed_cpu_us_1": round(cpu[1] / count * 1e6, 1),
        "windowed_cpu_us_4": round(cpu[4] / count * 1e6, 1),
    }
