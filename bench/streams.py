"""Streams benchmark (issue 17): what key-range tasks give a stateful application.

Everything runs on this machine (embedded Postgres and broker, the coordinator as its own
process); each ratio is against a baseline measured in the same run.

1. Scale-out past the partition count: a stateful word count (``examples.streams_wordcount``:
   a RocksDB store, a changelog write and an output record per word) over ``--records``
   (8,000) words of ``--keys`` (500) distinct words on ONE partition, each count costing
   ``--lookup-ms`` (1) of simulated I/O (an external lookup), run by 1, 2 and 4
   `keyrange streams` processes. The instances join first and the clock starts once the group
   has settled (every instance owns its final share), from the first word produced to the
   last count out. ``speedup_2`` and ``speedup_4`` are rates against 1
   instance; a partition-bound library stays at 1.
2. Restoration by key range: a changelog partition of ``--changelog-records`` (200,000)
   distinct keys restored into a RocksDB store, once for the whole key space and once for a
   quarter of it; ``restore_ratio = quarter time / whole time`` (median of ``--rounds`` (5)
   pairs), with the records read and restored by each (every record is fetched either way:
   the broker does not filter by key). A third restore per round, of a range holding no key,
   is the fetch-and-filter floor: ``restore_floor_ratio = its time / whole time`` bounds
   ``restore_ratio`` from below. ``restore_native`` says whether the C key filter judged the
   keys; the same restores judged by the Python loop (an install without a C compiler) give
   ``restore_ratio_python``.

3. The DSL (``bench/streams_dsl.py``): ``dsl_overhead``, the DSL word count's time over the
   hand-written processors', and ``windowed_speedup_4``, the page-views example with final
   results and ``--lookup-ms`` of I/O per view on 4 instances against 1, on one partition.

4. The per-instance rate (``bench/streams_rate.py``): ``rate_cpu_1``, the word count on one
   instance over ``--cpu-records`` (100,000) words with no simulated I/O, and the streams
   process's CPU per word; ``--cache-max-bytes`` sets the record cache for that run.

5. Failover (``bench/streams_failover.py``): ``failover_ratio``, the time from an instance's
   SIGKILL to its keys being processed again with a standby (``num_standby_replicas=1``) over
   without, on a store of ``--failover-keys`` (200,000) keys, and ``failover_restore_ratio``,
   the same from the moment the survivor was given the range.

``--phases scale,restore,dsl,windowed,cpu,failover`` picks the phases (all by default). Prints
one line per phase, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.commit import free_port
from bench.streams_dsl import dsl_overhead, windowed_speedup
from bench.streams_failover import failover_ratio
from bench.streams_rate import rate_cpu
from client.http import CoordinatorClient
from client.protocol.keyspace import KeyRange
from client.streams.restore import RestoreProgress, Restorer
from client.streams.stores import RocksStore
from coordinator.kafka import ClusterMetadata
from examples.demo_stack import Stack, produce
from tests.streams.harness import StreamsProcess, TopicReader, group_settled, start_streams

COORDINATOR_SETTINGS = {"log_format": "text", "metadata_refresh_ms": "1000"}
TARGET = "examples.streams_wordcount:build_topology"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def new_topics(stack: Stack, *names: str, split: bool = True) -> list[str]:
    suffix = os.urandom(4).hex()
    topics = [f"bench-{name}-{suffix}" for name in names]
    async with ClusterMetadata(stack.bootstrap) as cluster:
        for topic in topics:
            await cluster.create_topic(topic, 1)
    if split:
        async with CoordinatorClient(stack.coordinator_url) as client:
            for topic in topics:
                await client.set_accept_range_fetch(topic)
    return topics


async def word_count_seconds(
    stack: Stack, instances: int, args: argparse.Namespace, work: Path
) -> float:
    lines, words, counts = await new_topics(stack, "lines", "words", "counts")
    env = {
        "WORDCOUNT_LINES": lines,
        "WORDCOUNT_WORDS": words,
        "WORDCOUNT_COUNTS": counts,
        "WORDCOUNT_LOOKUP_MS": str(args.lookup_ms),
        "KEYRANGE_STREAMS_LOG_LEVEL": "WARNING",
    }
    app_id = f"bench-wc-{words}"
    processes: list[StreamsProcess] = []
    for index in range(instances):
        processes.append(
            await start_streams(
                TARGET,
                app_id,
                stack.bootstrap,
                stack.coordinator_url,
                work / f"{app_id}-{index}",
                env,
            )
        )
    try:
        await settled(stack, app_id, instances)
        keys = [b"word-%d" % (index % args.keys) for index in range(args.records)]
        async with TopicReader(stack.bootstrap, counts) as reader:
            started = time.monotonic()
            await produce_counts(stack.bootstrap, words, keys)
            while len(await reader.poll()) < args.records:
                if time.monotonic() - started > 600:
                    raise RuntimeError("word count did not finish")
            return time.monotonic() - started
    finally:
        for process in processes:
            await process.stop(signal.SIGTERM)


async def settled(stack: Stack, app_id: str, instances: int) -> None:
    """Until every instance owns its final share (what the assignor targets for it): a run
    timed from the first moment each owned something started with a quarter of the key
    space still being handed over."""
    deadline = time.monotonic() + 120
    while not await group_settled(stack.coordinator_url, app_id, instances):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{instances} instances did not settle")
        await asyncio.sleep(0.2)


async def produce_counts(bootstrap: str, topic: str, keys: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        one = (1).to_bytes(8, "big", signed=True)
        for key in keys:
            await producer.send(topic, key=key, value=one, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def scale_out(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    seconds = {count: await word_count_seconds(stack, count, args, work) for count in (1, 2, 4)}
    for count, value in seconds.items():
        log(f"word count, {count} instance(s): {args.records / value:.0f} words/s")
    return {
        "records": args.records,
        "lookup_ms": args.lookup_ms,
        "rate_1": round(args.records / seconds[1], 1),
        "speedup_2": round(seconds[1] / seconds[2], 2),
        "speedup_4": round(seconds[1] / seconds[4], 2),
    }


async def restore_times(
    restorer: Restorer, changelog: str, work: Path, rounds: int, label: str
) -> dict[str, list[RestoreProgress]]:
    # A one-hash range holds none of the keys: restoring it fetches and filters every record
    # and writes nothing, the floor under any key range's restore.
    ranges = {
        "whole": KeyRange.full(),
        "quarter": KeyRange.full().split(4)[1],
        "floor": KeyRange(0, 0),
    }
    measured: dict[str, list[RestoreProgress]] = {name: [] for name in ranges}
    for round_index in range(rounds):
        for name, keys_range in ranges.items():
            store = RocksStore(work / f"restore-{label}-{name}-{round_index}")
            progress = await restorer.restore(
                changelog, RestoreProgress("bench", 0, [keys_range], 0), store
            )
            store.close()
            measured[name].append(progress)
    return measured


async def restoration(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    (changelog,) = await new_topics(stack, "changelog", split=False)
    keys = [b"key-%d" % index for index in range(args.changelog_records)]
    await produce(stack.bootstrap, changelog, keys, value_size=32)
    restorer = Restorer({"bootstrap_servers": stack.bootstrap})
    # The same restores judged by the Python loop, what an install without a C compiler gets.
    python_restorer = Restorer({"bootstrap_servers": stack.bootstrap}, judge_in_c=False)
    await restorer.start()
    await python_restorer.start()
    try:
        measured = await restore_times(restorer, changelog, work, args.rounds, "native")
        in_python = await restore_times(python_restorer, changelog, work, args.rounds, "python")
    finally:
        await python_restorer.stop()
        await restorer.stop()
    whole, quarter, floor = (
        statistics.median(progress.seconds for progress in measured[name])
        for name in ("whole", "quarter", "floor")
    )
    python_whole, python_quarter = (
        statistics.median(progress.seconds for progress in in_python[name])
        for name in ("whole", "quarter")
    )
    log(f"restore: whole {whole:.2f} s, a quarter {quarter:.2f} s, no key {floor:.2f} s")
    log(f"restore judged in Python: whole {python_whole:.2f} s, a quarter {python_quarter:.2f} s")
    return {
        "restore_ratio": round(quarter / whole, 3),
        "restore_floor_ratio": round(floor / whole, 3),
        "restore_whole_s": round(whole, 3),
        "restore_quarter_s": round(quarter, 3),
        "restore_floor_s": round(floor, 3),
        "restore_records_read": measured["quarter"][0].read,
        "restore_records_restored_quarter": measured["quarter"][0].restored,
        "restore_records_restored_whole": measured["whole"][0].restored,
        "restore_native": restorer.judges_in_c,
        "restore_ratio_python": round(python_quarter / python_whole, 3),
        "restore_quarter_python_s": round(python_quarter, 3),
    }


async def run(stack: Stack, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {"benchmark": "streams"}
    if "scale" in args.phases:
        summary.update(await scale_out(stack, args, work))
    if "restore" in args.phases:
        summary.update(await restoration(stack, args, work))
    if "dsl" in args.phases:
        summary.update(await dsl_overhead(stack, args, work, new_topics))
    if "windowed" in args.phases:
        summary.update(await windowed_speedup(stack, args, work, new_topics))
    if "cpu" in args.phases:
        summary.update(await rate_cpu(stack, args, work, new_topics))
    if "failover" in args.phases:
        summary.update(await failover_ratio(stack, args, work, new_topics))
    return summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=8_000)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--lookup-ms", type=float, default=1.0)
    parser.add_argument("--changelog-records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dsl-lines", type=int, default=4_000)
    parser.add_argument("--dsl-rounds", type=int, default=3)
    parser.add_argument("--windowed-records", type=int, default=8_000)
    parser.add_argument("--windowed-users", type=int, default=5_000)
    parser.add_argument("--cpu-records", type=int, default=100_000)
    parser.add_argument(
        "--cache-max-bytes",
        type=int,
        default=None,
        help="the record cache of the streams processes the cpu phase starts (its default: unset)",
    )
    parser.add_argument("--failover-keys", type=int, default=200_000)
    parser.add_argument("--failover-rounds", type=int, default=1)
    parser.add_argument("--failover-session-ms", type=int, default=3_000)
    parser.add_argument(
        "--phases",
        type=lambda text: set(text.split(",")),
        default={"scale", "restore", "dsl", "windowed", "cpu", "failover"},
        help="comma-separated subset of scale,restore,dsl,windowed,cpu,failover",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="keyrange-bench-streams-") as work:
        stack = Stack(
            Path(work),
            database="bench_streams",
            port=free_port(),
            coordinator_settings=COORDINATOR_SETTINGS,
        )
        with stack:
            log(f"coordinator {stack.coordinator_url}, broker {stack.bootstrap}")
            summary = asyncio.run(run(stack, args, Path(work)))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
