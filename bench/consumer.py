"""Client SDK benchmark: scale-out past one partition, skewed keys, filter overhead, memory.

Everything runs on this machine in one run (embedded Postgres, embedded broker, the
coordinator as its own process), and every ratio is against a baseline measured in the same
run, so the numbers do not depend on how fast the machine is.

1. Scale-out. One partition of ``--records`` (10,000) records, keys uniform over 10,000 keys,
   ``--work-ms`` (2 ms) of simulated I/O per record. Baseline: a plain aiokafka group consumer
   processing the partition in order. Then Keyrange with 1, 2, 4 and 8 members, each a
   separate process processing its own records one at a time in offset order (``async for``,
   the same processing model and per-record work as the baseline, so the speedup comes from
   members alone; ``--run`` uses ``run(max_concurrency=1)`` instead).
   Members join first and start together on a signal once the group is stable, so the
   clock measures processing, not process start-up; it stops at the last processed record.
2. Skewed keys: the same with Zipf(s=1.0) keys over 1,000 keys and 8 members. Per-key order
   caps the speedup at ``total work / the largest member's work``; the largest member's work
   is computed from the key loads of the slices each member actually owned, and
   ``skew_efficiency_8 = measured speedup / that ideal``.
3. Filter overhead: ``--filter-records`` (1,000,000) records, read by one Keyrange member
   owning the full key range (every key hashed, every record tracked and marked processed,
   each ``getmany`` batch with ``mark_all_processed``) vs raw aiokafka ``getmany`` in the
   same run; each reader in its own process, alternated ``--filter-rounds`` (5) times. Each
   reader's clock runs from its first batch to its last record, so the rates are of
   consuming, not of connecting (Keyrange's extra start-up, the coordinator's offset fetch,
   is reported apart as ``filter_startup_extra_s``). ``filter_ratio`` is the median of the
   rounds' keyrange / raw rate ratios: the machine's speed drifts by tens of percent within
   a minute, and a ratio of two readers run back to back cancels most of it.
   The same rounds also run a member owning a quarter of the key space and one owning an
   eighth, each reading the whole partition: ``filter_ratio_quarter`` is the quarter member's
   rate in partition records/s (the records it got through, kept or skipped) over raw
   aiokafka's in the same round, median of the rounds; ``member_cpu_ms_per_1m`` is the eighth
   member's process CPU time per 1,000,000 partition records (``raw_cpu_ms_per_1m`` the raw
   reader's, ``filter_cpu_ms_per_1m`` the whole-range member's), from its first batch to its
   last record: unlike the rates, CPU time hardly moves with the machine's other load.
4. Member RSS: the peak resident memory of any Keyrange member process while consuming.

Prints one line per phase, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from bench.commit import free_port
from client import KeyRange, KeyrangeConsumer, key_hash
from coordinator.kafka import ClusterMetadata
from examples.demo_stack import (
    Stack,
    WorkerProcess,
    allow_range_fetch,
    produce,
    uniform_keys,
    zipf_keys,
)

SCRIPT = Path(__file__).resolve()
REPO_ROOT = SCRIPT.parent.parent

FULL = KeyRange.full()
SPACE = FULL.size
# Member sessions: short enough that a phase's members leave quickly, long enough that a
# busy 2-core machine never expires a live one.
SESSION_TIMEOUT_MS = 6_000
COORDINATOR_SETTINGS = {
    "session_timeout_min_ms": "1000",
    "heartbeat_interval_ms": "500",
    "reaper_interval_ms": "250",
    "metadata_refresh_ms": "1000",
    "log_format": "text",
}
STABLE_TIMEOUT_S = 90.0
PHASE_TIMEOUT_S = 300.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# phases 1, 2 and 4: worker processes


class Phase:
    """One group of gated worker processes over one topic."""

    def __init__(
        self, stack: Stack, args: argparse.Namespace, topic: str, mode: str, members: int
    ) -> None:
        self.stack = stack
        self.topic = topic
        self.mode = mode
        self.group = f"bench-{mode}-{members}-{uuid.uuid4().hex[:6]}"
        self.log_file = (args.work_dir / f"{self.group}.log").open("ab")
        options = [
            "--mode",
            mode,
            "--bootstrap",
            stack.bootstrap,
            "--coordinator",
            stack.coordinator_url,
            "--group",
            self.group,
            "--topic",
            topic,
            "--work-ms",
            str(args.work_ms),
            "--session-timeout-ms",
            str(SESSION_TIMEOUT_MS),
            "--report-ms",
            "100",
            "--gate",
            *([] if args.use_run else ["--iterate"]),
        ]
        self.workers = [WorkerProcess(f"{mode}-{i}", options) for i in range(members)]

    async def run(self, records: int) -> dict[str, Any]:
        try:
            for worker in self.workers:
                await worker.start(stderr=self.log_file)
            owned = await self._until_stable()
            started = time.time()
            for worker in self.workers:
                worker.go()
            peak_rss = await self._until_processed(records)
            finished = max(float(w.status.get("last_at", 0.0)) for w in self.workers)
            processed = sum(int(w.status["processed"]) for w in self.workers)
        finally:
            await asyncio.gather(*(worker.stop() for worker in self.workers))
            self.log_file.close()
        seconds = finished - started
        return {
            "seconds": seconds,
            "rate": records / seconds,
            "processed": processed,
            "owned": owned,
            "peak_rss_mb": peak_rss,
        }

    async def _until_stable(self) -> list[list[KeyRange]]:
        """Until every member is ready and the members' slices cover the key space."""
        deadline = time.monotonic() + STABLE_TIMEOUT_S
        while time.monotonic() < deadline:
            statuses = [worker.status for worker in self.workers]
            for status in statuses:
                if status.get("state") == "exited":
                    raise RuntimeError(f"worker {status['name']} exited; see {self.log_file.name}")
            if all(status.get("state") == "ready" for status in statuses):
                owned = [[KeyRange(*pair) for pair in s.get("owned", [])] for s in statuses]
                if all(owned) and sum(r.size for rs in owned for r in rs) == SPACE:
                    return owned
            await asyncio.sleep(0.1)
        raise RuntimeError(f"group {self.group} did not stabilise; see {self.log_file.name}")

    async def _until_processed(self, records: int) -> float:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        peak = 0.0
        while time.monotonic() < deadline:
            statuses = [worker.status for worker in self.workers]
            peak = max([peak, *(float(s.get("peak_rss_mb", 0.0)) for s in statuses)])
            if sum(int(s.get("processed", 0)) for s in statuses) >= records:
                return peak
            if any(s.get("state") == "exited" for s in statuses):
                raise RuntimeError(f"a worker exited early; see {self.log_file.name}")
            await asyncio.sleep(0.02)
        raise RuntimeError(f"group {self.group} did not finish in time")


def member_loads(keys: list[bytes], owned: list[list[KeyRange]]) -> list[int]:
    loads = [0] * len(owned)
    for offset, key in enumerate(keys):
        hashed = key_hash(key, offset)
        for index, ranges in enumerate(owned):
            if any(r.contains(hashed) for r in ranges):
                loads[index] += 1
                break
    return loads


async def create_topic(stack: Stack, name: str) -> None:
    async with ClusterMetadata(stack.bootstrap, request_timeout_ms=10_000) as cluster:
        await cluster.create_topic(name, 1)
    await allow_range_fetch(stack.coordinator_url, name)


async def scale_out(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    topic = f"bench-uniform-{uuid.uuid4().hex[:6]}"
    await create_topic(stack, topic)
    await produce(stack.bootstrap, topic, uniform_keys(args.records, 10_000, seed=1))
    baseline = await Phase(stack, args, topic, "aiokafka", 1).run(args.records)
    log(f"baseline aiokafka, 1 consumer: {baseline['rate']:8.1f} records/s")
    result: dict[str, Any] = {"baseline_rate": baseline["rate"], "peak_rss_mb": 0.0}
    for members in args.members:
        measured = await Phase(stack, args, topic, "keyrange", members).run(args.records)
        speedup = measured["rate"] / baseline["rate"]
        result[f"rate_{members}"] = measured["rate"]
        result[f"speedup_{members}"] = speedup
        result["peak_rss_mb"] = max(result["peak_rss_mb"], measured["peak_rss_mb"])
        log(
            f"keyrange, {members} member(s):   {measured['rate']:8.1f} records/s, "
            f"speedup {speedup:5.2f}, peak member RSS {measured['peak_rss_mb']:.1f} MB"
        )
    return result


async def skewed(stack: Stack, args: argparse.Namespace, baseline_rate: float) -> dict[str, Any]:
    topic = f"bench-zipf-{uuid.uuid4().hex[:6]}"
    keys = zipf_keys(args.records, 1_000, 1.0, seed=2)
    await create_topic(stack, topic)
    await produce(stack.bootstrap, topic, keys)
    members = max(args.members)
    measured = await Phase(stack, args, topic, "keyrange", members).run(args.records)
    loads = member_loads(keys, measured["owned"])
    ideal = args.records / max(loads)
    speedup = measured["rate"] / baseline_rate
    log(
        f"zipf keys, {members} members:    {measured['rate']:8.1f} records/s, speedup "
        f"{speedup:5.2f}, ideal {ideal:5.2f} (member loads {sorted(loads, reverse=True)})"
    )
    return {
        "members": members,
        "rate": measured["rate"],
        "speedup": speedup,
        "ideal": ideal,
        "efficiency": speedup / ideal,
        "loads": loads,
        "peak_rss_mb": measured["peak_rss_mb"],
    }


# --------------------------------------------------------------------------------------------
# phase 3: filter overhead, each reader in a child process


class ReadClock:
    """When a reader got its first batch and its last record, and how many records came
    after the first batch: the steady consuming rate, apart from connecting; and the
    process's CPU time over the same span."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first_batch_at = 0.0
        self.first_batch_cpu = 0.0
        self.first_batch = 0
        self.seen = 0

    def count(self, records: int) -> None:
        if not self.seen:
            self.first_batch_at = time.perf_counter()
            self.first_batch_cpu = time.process_time()
            self.first_batch = records
        self.seen += records

    def result(self) -> dict[str, float]:
        ended = time.perf_counter()
        return {
            "records": self.seen,
            "startup_s": self.first_batch_at - self.started,
            "rate": (self.seen - self.first_batch) / (ended - self.first_batch_at),
            "cpu_s": time.process_time() - self.first_batch_cpu,
            "steady": self.seen - self.first_batch,
        }


async def read_raw(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    clock = ReadClock()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while clock.seen < records:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                clock.count(len(batch))
        return clock.result()
    finally:
        await consumer.stop()


def owned_keys(share: int) -> KeyRange:
    """The key range of a member owning 1/``share`` of the key space (not the first piece,
    so both of its edges are inner ones)."""
    return FULL.split(share)[min(1, share - 1)]


async def read_keyrange(
    bootstrap: str, coordinator: str, topic: str, records: int, share: int
) -> dict[str, float]:
    clock = ReadClock()
    async with KeyrangeConsumer(
        bootstrap_servers=bootstrap,
        coordinator_url=coordinator,
        group_id=f"bench-filter-{uuid.uuid4().hex[:6]}",
    ) as consumer:
        consumer.assign({TopicPartition(topic, 0): [owned_keys(share)]})
        while clock.seen < records:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                consumer.mark_all_processed(batch)
                clock.count(len(batch))
        return clock.result()


def filter_child(args: argparse.Namespace) -> None:
    """Child process entry: read the topic one way, print a JSON result."""

    async def read() -> dict[str, float]:
        if args.filter_child == "raw":
            return await read_raw(args.bootstrap, args.topic, args.filter_records)
        return await read_keyrange(
            args.bootstrap, args.coordinator, args.topic, args.filter_records, args.filter_share
        )

    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    result = asyncio.run(read())
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    result["rss_mb"] = psutil.Process().memory_info().rss / 2**20
    print(json.dumps(result), flush=True)


async def run_filter_child(
    stack: Stack,
    args: argparse.Namespace,
    topic: str,
    kind: str,
    profile: Path | None = None,
    *,
    records: int | None = None,
    share: int = 1,
) -> dict[str, float]:
    command = [
        sys.executable,
        "-m",
        "bench.consumer",
        "--filter-child",
        kind,
        "--bootstrap",
        stack.bootstrap,
        "--coordinator",
        stack.coordinator_url,
        "--topic",
        topic,
        "--filter-records",
        str(args.filter_records if records is None else records),
        "--filter-share",
        str(share),
    ]
    if profile is not None:
        command += ["--profile", str(profile)]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT
    )
    peak = 0.0
    watched = psutil.Process(process.pid)
    communicate = asyncio.ensure_future(process.communicate())
    while not communicate.done():
        try:
            peak = max(peak, watched.memory_info().rss / 2**20)
        except psutil.NoSuchProcess:
            break
        await asyncio.wait({communicate}, timeout=0.1)
    stdout, _ = await communicate
    if process.returncode != 0:
        raise RuntimeError(f"filter reader {kind} failed with code {process.returncode}")
    result: dict[str, float] = json.loads(stdout.decode().strip().splitlines()[-1])
    result["peak_rss_mb"] = max(peak, result["rss_mb"])
    return result


async def filter_overhead(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    topic = f"bench-filter-{uuid.uuid4().hex[:6]}"
    await create_topic(stack, topic)
    started = time.perf_counter()
    keys = uniform_keys(args.filter_records, 100_000, seed=3)
    await produce(stack.bootstrap, topic, keys)
    log(f"produced {args.filter_records} records in {time.perf_counter() - started:.1f} s")
    owned = {share: owned_keys(share) for share in (4, 8)}
    kept = {
        share: sum(1 for offset, key in enumerate(keys) if keys_.contains(key_hash(key, offset)))
        for share, keys_ in owned.items()
    }
    raw_rates: list[float] = []
    keyrange_rates: list[float] = []
    ratios: list[float] = []
    quarter_ratios: list[float] = []
    member_cpu: list[float] = []
    raw_cpu: list[float] = []
    whole_cpu: list[float] = []
    startup_extra: list[float] = []
    peak_rss = raw_peak_rss = 0.0
    for _ in range(args.filter_rounds):
        raw = await run_filter_child(stack, args, topic, "raw")
        ours = await run_filter_child(stack, args, topic, "keyrange")
        quarter = await run_filter_child(stack, args, topic, "keyrange", records=kept[4], share=4)
        eighth = await run_filter_child(stack, args, topic, "keyrange", records=kept[8], share=8)
        # The partition records a member got through: what it kept, over its share of them.
        quarter_rate = quarter["rate"] * args.filter_records / kept[4]
        eighth_partition = eighth["steady"] * args.filter_records / kept[8]
        raw_rates.append(raw["rate"])
        keyrange_rates.append(ours["rate"])
        ratios.append(ours["rate"] / raw["rate"])
        quarter_ratios.append(quarter_rate / raw["rate"])
        member_cpu.append(1000 * eighth["cpu_s"] * 1_000_000 / eighth_partition)
        raw_cpu.append(1000 * raw["cpu_s"] * 1_000_000 / raw["steady"])
        whole_cpu.append(1000 * ours["cpu_s"] * 1_000_000 / ours["steady"])
        startup_extra.append(ours["startup_s"] - raw["startup_s"])
        peak_rss = max(peak_rss, ours["peak_rss_mb"], quarter["peak_rss_mb"])
        raw_peak_rss = max(raw_peak_rss, raw["peak_rss_mb"])
        log(
            f"filter: raw aiokafka {raw['rate']:9.0f} records/s, keyrange "
            f"{ours['rate']:9.0f} records/s, ratio {ratios[-1]:.2f}; a quarter "
            f"{quarter_rate:9.0f} partition records/s, ratio {quarter_ratios[-1]:.2f}; an "
            f"eighth {member_cpu[-1]:.0f} CPU ms per 1M (whole {whole_cpu[-1]:.0f}, raw "
            f"{raw_cpu[-1]:.0f}); start-up raw "
            f"{raw['startup_s']:.2f} s, keyrange {ours['startup_s']:.2f} s, reader RSS raw "
            f"{raw['peak_rss_mb']:.0f} MB, keyrange {ours['peak_rss_mb']:.0f} MB, load "
            f"{os.getloadavg()[0]:.2f}"
        )
    result: dict[str, Any] = {
        "raw_rate": statistics.median(raw_rates),
        "keyrange_rate": statistics.median(keyrange_rates),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "quarter_ratio": statistics.median(quarter_ratios),
        "quarter_ratios": quarter_ratios,
        "member_cpu_ms_per_1m": statistics.median(member_cpu),
        "raw_cpu_ms_per_1m": statistics.median(raw_cpu),
        "whole_cpu_ms_per_1m": statistics.median(whole_cpu),
        "startup_extra_s": statistics.median(startup_extra),
        "peak_rss_mb": peak_rss,
        "raw_peak_rss_mb": raw_peak_rss,
    }
    if args.profile_dir is not None:
        profile = args.profile_dir / "keyrange-filter.prof"
        profile.parent.mkdir(parents=True, exist_ok=True)
        await run_filter_child(stack, args, topic, "keyrange", profile)
        stats = pstats.Stats(str(profile))
        stats.sort_stats("tottime").print_stats(15)
        log(f"profile of the keyrange reader written to {profile}")
    return result


# --------------------------------------------------------------------------------------------


async def run(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {"records": args.records, "work_ms": args.work_ms}
    member_rss = 0.0
    if "scale" in args.phases:
        scale = await scale_out(stack, args)
        members = max(args.members)
        summary["baseline_rate"] = round(scale["baseline_rate"], 1)
        for n in args.members:
            summary[f"rate_{n}"] = round(scale[f"rate_{n}"], 1)
        for n in args.members:
            summary[f"speedup_{n}"] = round(scale[f"speedup_{n}"], 3)
        member_rss = scale["peak_rss_mb"]
        if "skew" in args.phases:
            skew = await skewed(stack, args, scale["baseline_rate"])
            summary[f"skew_rate_{members}"] = round(skew["rate"], 1)
            summary[f"skew_speedup_{members}"] = round(skew["speedup"], 3)
            summary[f"skew_ideal_{members}"] = round(skew["ideal"], 3)
            summary[f"skew_efficiency_{members}"] = round(skew["efficiency"], 3)
            member_rss = max(member_rss, skew["peak_rss_mb"])
    if "filter" in args.phases:
        overhead = await filter_overhead(stack, args)
        summary.update(
            filter_records=args.filter_records,
            filter_raw_rate=round(overhead["raw_rate"]),
            filter_keyrange_rate=round(overhead["keyrange_rate"]),
            filter_ratio=round(overhead["ratio"], 3),
            filter_round_ratios=[round(ratio, 3) for ratio in overhead["ratios"]],
            filter_ratio_quarter=round(overhead["quarter_ratio"], 3),
            filter_quarter_round_ratios=[round(r, 3) for r in overhead["quarter_ratios"]],
            member_cpu_ms_per_1m=round(overhead["member_cpu_ms_per_1m"]),
            raw_cpu_ms_per_1m=round(overhead["raw_cpu_ms_per_1m"]),
            filter_cpu_ms_per_1m=round(overhead["whole_cpu_ms_per_1m"]),
            load_average=round(os.getloadavg()[0], 2),
            filter_startup_extra_s=round(overhead["startup_extra_s"], 3),
            filter_reader_rss_mb=round(overhead["peak_rss_mb"], 1),
            filter_raw_reader_rss_mb=round(overhead["raw_peak_rss_mb"], 1),
        )
    summary["member_rss_mb"] = round(member_rss, 1)
    return summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument(
        "--members", type=lambda text: [int(n) for n in text.split(",")], default=[1, 2, 4, 8]
    )
    parser.add_argument(
        "--run",
        dest="use_run",
        action="store_true",
        help="members process with run(max_concurrency=1) instead of `async for`",
    )
    parser.add_argument(
        "--phases",
        type=lambda text: set(text.split(",")),
        default={"scale", "skew", "filter"},
        help="comma-separated subset of scale,skew,filter (skew needs scale's baseline)",
    )
    parser.add_argument("--filter-records", type=int, default=1_000_000)
    parser.add_argument("--filter-rounds", type=int, default=5)
    parser.add_argument(
        "--profile-dir", type=Path, default=None, help="also profile the keyrange reader"
    )
    # Child-process mode of the filter phase.
    parser.add_argument("--filter-child", choices=["raw", "keyrange"], help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    parser.add_argument("--filter-share", type=int, default=1, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.filter_child:
        filter_child(args)
        return
    with tempfile.TemporaryDirectory(prefix="keyrange-bench-client-") as work:
        args.work_dir = Path(work)
        stack = Stack(
            args.work_dir,
            database="bench_client",
            port=free_port(),
            coordinator_settings=COORDINATOR_SETTINGS,
        )
        with stack:
            log(f"coordinator {stack.coordinator_url}, broker {stack.bootstrap}")
            summary = asyncio.run(run(stack, args))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
