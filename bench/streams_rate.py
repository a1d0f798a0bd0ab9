"""The per-instance rate phase of ``make bench-streams`` (issue 30): ``rate_cpu_1``.

The word count (``examples.streams_wordcount``: lines split into words, re-keyed through a
topic, counted in a RocksDB store with a changelog write per update and an output record per
word) on ONE instance over ``--cpu-records`` (100,000) words, lines of 5 of 500 distinct
words on one partition, with no simulated I/O, so what it measures
is the runtime's own cost per record (goal >= 30,000 records/s on the 2-core machine). The
clock starts once the group has settled and runs from the first word produced to the last
count out. Beside the wall-clock rate, which the machine's load moves, the phase reports the
streams process's CPU time over the same interval per record (``rate_cpu_1_cpu_us``, from
``/proc``), and how many changelog records the run wrote (``rate_cpu_1_changelog``), which
the record cache (``--cache-max-bytes``, docs/streams.md) divides.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.streams_dsl import WORDS, _produce
from examples.demo_stack import Stack
from tests.streams.harness import (
    StreamsProcess,
    TopicReader,
    decode,
    group_settled,
    start_streams,
)

TARGET = "examples.streams_wordcount:build_topology"
NewTopics = Callable[..., Awaitable[list[str]]]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` so far (``/proc/<pid>/stat``, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _settle(stack: Stack, app_id: str, topics: tuple[str, ...]) -> None:
    deadline = time.monotonic() + 120
    while not await group_settled(stack.coordinator_url, app_id, 1, topics):
        if time.monotonic() > deadline:
            raise RuntimeError("the instance did not settle")
        await asyncio.sleep(0.2)


async def _count_changelog(stack: Stack, topic: str) -> int:
    async with TopicReader(stack.bootstrap, topic) as reader:
        return len(await reader.read_to_end())


async def rate_cpu(
    stack: Stack, args: argparse.Namespace, work: Path, new_topics: NewTopics
) -> dict[str, Any]:
    """One timed run of the word count on one instance with no I/O (see the docstring)."""
    lines, words, counts = await new_topics(stack, "lines", "words", "counts")
    app_id = f"bench-cpu-{words}"
    env = {
        "WORDCOUNT_LINES": lines,
        "WORDCOUNT_WORDS": words,
        "WORDCOUNT_COUNTS": counts,
        "WORDCOUNT_LOOKUP_MS": "0",
        "KEYRANGE_STREAMS_LOG_LEVEL": "WARNING",
    }
    if args.cache_max_bytes is not None:
        env["KEYRANGE_STREAMS_CACHE_MAX_BYTES"] = str(args.cache_max_bytes)
    stamp = int(time.time() * 1000)
    process: StreamsProcess = await start_streams(
        TARGET, app_id, stack.bootstrap, stack.coordinator_url, work / app_id, env
    )
    # Lines of five words, as ``dsl_overhead`` feeds: the producer in this process keeps
    # ahead of the instance (words one by one did not: it measured the producer).
    lines_fed = [
        (
            b"%d" % index,
            " ".join(WORDS[(index * 7 + step) % len(WORDS)] for step in range(5)).encode(),
            stamp,
        )
        for index in range(args.cpu_records // 5)
    ]
    expected = Counter(word.decode() for _, line, _ in lines_fed for word in line.split())
    try:
        await _settle(stack, app_id, (words,))
        async with TopicReader(stack.bootstrap, counts) as reader:
            cpu_before = cpu_seconds(process.process.pid)
            started = time.monotonic()
            await _produce(stack.bootstrap, lines, lines_fed)
            # Until every word's count reached the reference (a count out per word is not
            # enough: a membership lost under load processes some words twice).
            final: dict[str, int] = {}
            read = 0
            while any(final.get(word, 0) < count for word, count in expected.items()):
                records = await reader.poll()
                for record in records[read:]:
                    final[record.key.decode()] = decode(record.value)
                read = len(records)
                if time.monotonic() - started > 600:
                    raise RuntimeError("the word count did not finish")
            seconds = time.monotonic() - started
            cpu = cpu_seconds(process.process.pid) - cpu_before
    finally:
        await process.stop(signal.SIGTERM)
    # At-least-once: a membership lost under load processes records again, so a count may
    # end above the reference (reported), never below it (the loop above waits for that).
    if set(final) != set(expected):
        raise RuntimeError("the word count counted words it was never given")
    reprocessed = sum(final.values()) - sum(expected.values())
    changelog = await _count_changelog(stack, f"{app_id}-counts-changelog")
    rate = args.cpu_records / seconds
    log(
        f"word count, 1 instance, no I/O: {rate:.0f} words/s, "
        f"{cpu / args.cpu_records * 1e6:.1f} us of CPU a word, {changelog} changelog records, "
        f"{reprocessed} words counted again"
    )
    return {
        "rate_cpu_records": args.cpu_records,
        "rate_cpu_1": round(rate, 1),
        "rate_cpu_1_cpu_us": round(cpu / args.cpu_records * 1e6, 2),
        "rate_cpu_1_changelog": changelog,
        "rate_cpu_1_reprocessed": reprocessed,
        "cache_max_bytes": args.cache_max_bytes,
    }
