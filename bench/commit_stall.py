"""How long one large commit stalls everybody else's requests (issue 14: a commit of 10,000
partitions, in limits, must not hold other requests up for more than about 100 ms).

One coordinator process (``python -m coordinator serve``) on an embedded Postgres. A prober
sends ``GET /livez`` over one keep-alive connection, one request after another, and records
each latency: ``/livez`` does no I/O, so its latency is the time the coordinator's event loop
took to get to it. Two phases in one run:

- **baseline**: the prober alone, ``--baseline-s`` seconds;
- **large commits**: ``--commits`` commits of ``--partitions`` partitions each, one after the
  other (the first creates the group's rows, the later ones rewrite them), each partition
  carrying one key-range watermark and two IC ranges, while the prober runs.

``stall_ms`` is the longest probe during the large commits; ``stall_ratio`` divides it by the
longest probe of the baseline (what the machine does anyway). Prints one line per phase, then
one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench.commit import SERVE, bench_database, coordinator_process, free_port, percentile

HASH_MAX = 2**63 - 1
TOPIC = "stall"
GOAL_STALL_MS = 100.0
PROBE_PAUSE_S = 0.002


def commit_body(partitions: int, round_: int) -> bytes:
    """One commit of every partition: a watermark over the whole key space and two IC ranges
    above it, all higher than the previous round's."""
    mark = 10 * (round_ + 1)
    entries = [
        {
            "topic": TOPIC,
            "partition": partition,
            "watermarks": [[0, HASH_MAX, mark]],
            "ranges": [[mark + 2, mark + 3], [mark + 6, mark + 7]],
        }
        for partition in range(partitions)
    ]
    return json.dumps({"partitions": entries}).encode()


async def probe(base_url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            reply = await client.get("/livez")
            latencies.append((time.perf_counter() - started) * 1000)
            reply.raise_for_status()
            await asyncio.sleep(PROBE_PAUSE_S)


async def probed(base_url: str, work: asyncio.Future[list[float]] | float) -> list[float]:
    """Probe latencies while ``work`` runs (or for that many seconds)."""
    stop = asyncio.Event()
    latencies: list[float] = []
    prober = asyncio.create_task(probe(base_url, stop, latencies))
    try:
        if isinstance(work, float):
            await asyncio.sleep(work)
        else:
            await work
    finally:
        stop.set()
        await prober
    return latencies


async def large_commits(base_url: str, partitions: int, commits: int) -> list[float]:
    bodies = [commit_body(partitions, round_) for round_ in range(commits)]
    durations: list[float] = []
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        for body in bodies:
            started = time.perf_counter()
            reply = await client.post(
                "/v1/groups/stall/offsets/commit", content=body, headers=headers
            )
            durations.append((time.perf_counter() - started) * 1000)
            if reply.status_code != 200:
                raise SystemExit(f"commit refused: {reply.status_code} {reply.text[:500]}")
    return durations


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "probes": len(ordered),
        "p50_ms": round(percentile(ordered, 0.5), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
        "max_ms": round(ordered[-1], 2),
    }


async def run(args: argparse.Namespace, base_url: str) -> dict[str, object]:
    await probed(base_url, 1.0)  # warm-up: connections, code paths
    baseline = summary(await probed(base_url, args.baseline_s))
    print(f"baseline: {baseline}")
    work = asyncio.ensure_future(large_commits(base_url, args.partitions, args.commits))
    during = summary(await probed(base_url, work))
    durations = work.result()
    print(f"during {args.commits} commits of {args.partitions} partitions: {during}")
    print(f"commit durations (ms): {[round(d) for d in durations]}")
    stall = during["max_ms"]
    return {
        "benchmark": "commit_stall",
        "partitions_per_commit": args.partitions,
        "commits": args.commits,
        "commit_ms": [round(d, 1) for d in durations],
        "baseline": baseline,
        "during": during,
        "stall_ms": stall,
        "stall_ratio": round(stall / baseline["max_ms"], 2),
        "goal_stall_ms": GOAL_STALL_MS,
        "meets_goal": stall <= GOAL_STALL_MS,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--commits", type=int, default=5)
    parser.add_argument("--baseline-s", type=float, default=3.0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="keyrange-stall-") as work:
        work_dir = Path(work)
        with bench_database(work_dir) as (database_url, _):
            from coordinator import migrate

            migrate.upgrade(database_url)
            port = free_port()
            with coordinator_process(SERVE, database_url, port, work_dir / "coordinator.log"):
                result = asyncio.run(run(args, f"http://127.0.0.1:{port}"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
