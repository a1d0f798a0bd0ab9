"""Worker runtime benchmark (issue 16): Parallel Consumer's workload, CPU-bound handlers on a
process pool, memory under backpressure, and what a retrying key costs the others.

Everything runs on this machine (embedded Postgres and broker, the coordinator as its own
process); every ratio is against a baseline measured in the same run.

1. Parallel Consumer's workload: ``--records`` (10,000) records on one partition, 0-5 ms of
   simulated I/O each (seeded, the same for every run), ``--concurrency`` (100), with 1, 2,
   10, 100 and 10,000 distinct keys and Zipf(1.0) keys over 1,000. Baseline: an in-order
   aiokafka consumer awaiting each record's I/O (its rate is measured on
   ``--baseline-records`` records: it takes 3 ms a record whatever the keys). Each handler
   measures its own time, so the timer granularity of the simulated I/O does not count
   against the runtime; ``efficiency = ideal / measured``, ``ideal = max(total handler time
   / concurrency, the heaviest key's handler time)``; ``speedup = measured rate / baseline
   rate``. The handler form gives ``efficiency_<keys>`` and ``speedup_<keys>`` (``zipf`` for
   the Zipf keys); the task form (``--subpartitions`` tasks per partition, each awaiting its
   record's I/O before acknowledging) gives ``task_efficiency_<keys>`` beside.
2. CPU-bound: ``--cpu-records`` (4,000) records of ~1 ms of pure Python each, uniform keys,
   on a process pool of 2 (``--cpu-concurrency`` 16 records at once) vs in order in one
   process, paired back to back ``--rounds`` times; ``cpu_speedup`` is the median ratio.
   ``cpu_pool_ceiling`` is what two processes give the machine at that time (the same work
   in large batches on a bare process pool, no Kafka, no per-record cost): on a shared
   machine it is well under 2, and ``cpu_speedup`` can be read against it
   (``cpu_of_ceiling``, per round). Where the CPU went, from the first outcome to the last:
   ``cpu_parent_ms_per_record`` (the worker's process: fetching, the engine, feeding the
   pool), ``cpu_children_ms_per_record`` (the handler and the children's side of the pipe),
   ``cpu_stack_ms_per_record`` (broker, coordinator, Postgres), ``cpu_children_busy`` (the
   share of the time a child worked), ``cpu_children_waiting`` (the share a child waited for
   records, as the children measure it), ``cpu_foreign_cores`` (other programs), and
   ``cpu_in_order_ms_per_record`` (the baseline's process). ``cpu_speedup_by_cpu_time = 2
   x in-order / (parent + children)`` is what those costs give two idle cores: unlike the
   rates it hardly moves with the machine's other load.
3. Memory under backpressure: a backlog of ``--backlog-mb`` (1,024) MB and a slow handler in
   a worker process with ``max_buffered_bytes`` of ``--bound-mb`` (64); its peak RSS while
   it runs for ``--memory-seconds`` (20); ``rss_over_bound_mb = peak - bound``.
4. A retrying key: Parallel Consumer's workload on ``--retry-records`` (30,000) records over
   100 keys, once plain and once with one hot key (10% of the records) whose every record
   fails twice before succeeding (policy retry, 10-50 ms backoff); ``retry_cost = 1 - the
   other keys' rate with the retries / without``, the median of ``--rounds`` (5) pairs.
5. Tracing's cost: Parallel Consumer's workload (handler form, 100 and Zipf keys) with
   OpenTelemetry tracing on (a span per record, exported through a batch processor to the
   SDK's in-memory exporter) and off (``OTEL_SDK_DISABLED``), alternated ``--rounds`` times;
   ``traced_efficiency_ratio_<keys>`` is the median of traced efficiency / untraced.

Prints one line per phase, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from bench.commit import CpuMeter, foreign_load, free_port
from client.worker import RecordObserver, Worker, WorkerConfig, WorkerTask
from coordinator.kafka import ClusterMetadata
from examples.demo_stack import Stack, produce, uniform_keys, zipf_keys

REPO_ROOT = Path(__file__).resolve().parent.parent
COORDINATOR_SETTINGS = {"log_format": "text", "metadata_refresh_ms": "1000"}
PHASE_TIMEOUT_S = 600.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def work_of(offset: int, seed: int = 16) -> float:
    """The simulated I/O of a record, 0-5 ms, the same in every run."""
    return random.Random(seed * 1_000_003 + offset).uniform(0.0, 0.005)


async def new_topic(stack: Stack, keys: list[bytes], value_size: int = 64) -> str:
    name = f"bench-workers-{uuid.uuid4().hex[:8]}"
    async with ClusterMetadata(stack.bootstrap, request_timeout_ms=10_000) as cluster:
        await cluster.create_topic(name, 1)
    await produce(stack.bootstrap, name, keys, value_size=value_size)
    return name


def config(stack: Stack, topic: str, **options: Any) -> WorkerConfig:
    return WorkerConfig(
        topics=[topic],
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        bootstrap_servers=stack.bootstrap,
        coordinator_url=stack.coordinator_url,
        drain_timeout_s=5.0,
        **options,
    )


# --------------------------------------------------------------------------------------------
# phase 1: Parallel Consumer's workload


async def in_order_rate(stack: Stack, topic: str, records: int, cpu: bool = False) -> float:
    """An aiokafka consumer processing one record after another; records per second."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=stack.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        done = 0
        started = time.perf_counter()
        while done < records:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                for record in batch[: records - done]:
                    if cpu:
                        burn(record)
                    else:
                        await asyncio.sleep(work_of(record.offset))
                    done += 1
        return records / (time.perf_counter() - started)
    finally:
        await consumer.stop()


class Clock:
    """Per-key handler time and the span from the first handler start to the last end."""

    def __init__(self, records: int) -> None:
        self.records = records
        self.by_key: dict[bytes, float] = defaultdict(float)
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.done = asyncio.Event()

    async def handle(self, record: Any) -> None:
        started = time.perf_counter()
        self.first = self.first or started
        await asyncio.sleep(work_of(record.offset))
        ended = time.perf_counter()
        self.by_key[record.key] += ended - started
        self.count += 1
        self.last = ended
        if self.count >= self.records:
            self.done.set()

    def figures(self, concurrency: int) -> dict[str, float]:
        measured = self.last - self.first
        total = sum(self.by_key.values())
        ideal = max(total / concurrency, max(self.by_key.values()))
        return {"efficiency": ideal / measured, "rate": self.records / measured}


def timed_task(clock: Clock) -> type[WorkerTask]:
    class Timed(WorkerTask):
        async def process(self, record: Any, observer: RecordObserver) -> None:
            await clock.handle(record)
            observer.success()

    return Timed


async def run_until(worker: Worker, done: asyncio.Event) -> None:
    running = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            waiting = asyncio.create_task(done.wait())
            await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if running.done():
                running.result()
                raise RuntimeError("the worker stopped before processing every record")
    finally:
        worker.stop()
        await running


async def parallel_consumer(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    records, concurrency = args.records, args.concurrency
    distributions: dict[str, list[bytes]] = {
        str(n): uniform_keys(records, n, seed=n) for n in (1, 2, 10, 100, 10_000)
    }
    distributions["zipf"] = zipf_keys(records, 1_000, 1.0, seed=7)
    summary: dict[str, Any] = {}
    baseline_topic = await new_topic(stack, distributions["100"][: args.baseline_records])
    baseline = await in_order_rate(stack, baseline_topic, args.baseline_records)
    summary["baseline_rate"] = round(baseline, 1)
    log(f"in-order baseline: {baseline:.0f} records/s")
    for name, keys in distributions.items():
        topic = await new_topic(stack, keys)
        for form in ("handler", "task"):
            clock = Clock(records)
            settings = config(stack, topic, max_concurrency=concurrency)
            if form == "handler":
                worker = Worker(settings, handler=clock.handle)
            else:
                settings = config(
                    stack, topic, max_concurrency=concurrency, subpartitions=args.subpartitions
                )
                worker = Worker(settings, task=timed_task(clock))
            await run_until(worker, clock.done)
            figures = clock.figures(concurrency)
            prefix = "" if form == "handler" else "task_"
            summary[f"{prefix}efficiency_{name}"] = round(figures["efficiency"], 3)
            summary[f"{prefix}speedup_{name}"] = round(figures["rate"] / baseline, 2)
            log(
                f"{form} form, {name} keys: {figures['rate']:.0f} records/s, "
                f"efficiency {figures['efficiency']:.3f}, speedup {figures['rate'] / baseline:.1f}"
            )
    return summary


# --------------------------------------------------------------------------------------------
# phase 2: CPU-bound handlers on a process pool


def burn(record: Any) -> int:
    """About 1 ms of pure Python."""
    total = 0
    for index in range(25_000):
        total += index * index % 7
    return total


class Counter:
    def __init__(self, records: int) -> None:
        self.records = records
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.done = asyncio.Event()

    def count_one(self) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.count += 1
        self.last = now
        if self.count >= self.records:
            self.done.set()


async def cpu_bound(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    records = args.cpu_records
    topic = await new_topic(stack, uniform_keys(records, 10_000, seed=3))
    ratios: list[float] = []
    ceilings: list[float] = []
    accounts: list[dict[str, float]] = []
    for _ in range(args.rounds):
        # Paired back to back: on a shared machine the speed of both sides drifts together.
        ceilings.append(await asyncio.to_thread(pool_ceiling, records))
        started = time.process_time()
        baseline = await in_order_rate(stack, topic, records, cpu=True)
        in_order_ms = 1000 * (time.process_time() - started) / records
        counter = Counter(records)
        settings = config(stack, topic, processes=2, max_concurrency=args.cpu_concurrency)
        worker = Worker(settings, handler=burn)
        meter = CpuAccount(psutil.Process())
        # The pool's outcomes are counted as the engine marks them.
        marks = asyncio.create_task(_count_marks(worker, counter, meter))
        await run_until(worker, counter.done)
        marks.cancel()
        rate = records / (counter.last - counter.first)
        ratios.append(rate / baseline)
        # What the same CPU per record would give on two idle cores with children that
        # never wait: a rate's ratio that the machine's other load does not move.
        spent = sum(meter.figures[f"{name}_ms_per_record"] for name in ("parent", "children"))
        meter.figures["in_order_ms_per_record"] = in_order_ms
        meter.figures["speedup_by_cpu_time"] = 2 * in_order_ms / spent
        accounts.append(meter.figures)
        log(
            f"cpu-bound: in order {baseline:.0f} records/s, process pool of 2 {rate:.0f}; "
            + ", ".join(f"{name} {value:.3f}" for name, value in meter.figures.items())
        )
    summary: dict[str, Any] = {
        "cpu_speedup": round(statistics.median(ratios), 3),
        "cpu_round_speedups": [round(ratio, 3) for ratio in ratios],
        "cpu_pool_ceiling": round(statistics.median(ceilings), 3),
        "cpu_round_ceilings": [round(ceiling, 3) for ceiling in ceilings],
        "cpu_round_foreign_cores": [round(a["foreign_cores"], 2) for a in accounts],
        "cpu_of_ceiling": round(
            statistics.median(r / c for r, c in zip(ratios, ceilings, strict=True)), 3
        ),
    }
    for name in accounts[0]:
        summary[f"cpu_{name}"] = round(statistics.median(a[name] for a in accounts), 3)
    return summary


class CpuAccount:
    """Where the CPU went while the pool's records were processed, from the first outcome
    to the last: the worker's process (fetching, the engine, feeding the pool), its pool's
    children, the stack (broker, coordinator, Postgres), other programs on the machine.
    Unlike rates these hardly depend on how busy the machine is, so they say what the
    runtime costs per record whatever the load."""

    def __init__(self, me: psutil.Process) -> None:
        self._me = me
        # Processes that existed before the worker: the stack's (and its Postgres backends).
        self._before = {process.pid for process in me.children(recursive=True)}
        self._meter: CpuMeter | None = None
        self._first_count = 0
        self._first_waited_s = 0.0
        self._started = 0.0
        self.figures: dict[str, float] = {}

    def _pool(self) -> list[psutil.Process]:
        return [p for p in self._me.children(recursive=True) if p.pid not in self._before]

    def _stack(self) -> list[psutil.Process]:
        return [p for p in self._me.children(recursive=True) if p.pid in self._before]

    def start(self, count: int, waited_s: float) -> None:
        self._first_count = count
        self._first_waited_s = waited_s
        self._started = time.perf_counter()
        self._meter = CpuMeter(
            {"parent": lambda: [self._me], "children": self._pool, "stack": self._stack}
        )
        self._meter.start()

    def stop(self, count: int, waited_s: float) -> None:
        assert self._meter is not None
        children = len(self._meter.processes["children"])
        cores = self._meter.stop()
        wall = time.perf_counter() - self._started
        rate = (count - self._first_count) / wall
        self.figures = {
            f"{name}_ms_per_record": 1000 * cores[name] / rate
            for name in ("parent", "children", "stack")
        }
        # Of the children's time, the share they spent working.
        self.figures["children_busy"] = cores["children"] / max(children, 1)
        # Of the children's time, the share they waited for records (as they measured it).
        self.figures["children_waiting"] = (waited_s - self._first_waited_s) / (
            max(children, 1) * wall
        )
        self.figures["foreign_cores"] = foreign_load(cores)


def _burn_many(count: int) -> None:
    for _ in range(count):
        burn(None)


def pool_ceiling(records: int) -> float:
    """What two processes give this machine now: the same work as 40 large batches on a
    bare process pool, against one process, no Kafka and no per-record cost."""
    started = time.perf_counter()
    _burn_many(records // 2)
    serial = time.perf_counter() - started
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_burn_many, [1, 1]))
        started = time.perf_counter()
        list(pool.map(_burn_many, [records // 80] * 40))
        parallel = time.perf_counter() - started
    return serial / parallel


async def _count_marks(worker: Worker, counter: Counter, account: CpuAccount) -> None:
    seen = 0
    while True:
        processed = worker.stats.processed
        if processed and not seen:
            account.start(processed, worker.process_wait_s)
        for _ in range(processed - seen):
            counter.count_one()
        seen = processed
        if counter.done.is_set():
            account.stop(processed, worker.process_wait_s)
            return
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------------------------
# phase 3: memory under backpressure


async def memory(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    value_size = 10_000
    count = args.backlog_mb * 1024 * 1024 // value_size
    topic = await new_topic(stack, uniform_keys(count, 10_000, seed=5), value_size=value_size)
    log(f"memory: backlog of {count} records of {value_size} bytes written")
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.memory_worker",
        "--bootstrap",
        stack.bootstrap,
        "--coordinator",
        stack.coordinator_url,
        "--topic",
        topic,
        "--bound-mb",
        str(args.bound_mb),
        cwd=REPO_ROOT,
    )
    peak = 0.0
    process = psutil.Process(child.pid)
    deadline = time.monotonic() + args.memory_seconds
    try:
        while time.monotonic() < deadline and child.returncode is None:
            peak = max(peak, process.memory_info().rss / 1024 / 1024)
            await asyncio.sleep(0.1)
    finally:
        child.terminate()
        await child.wait()
    log(f"memory: peak RSS {peak:.0f} MB with a bound of {args.bound_mb} MB")
    return {
        "backlog_mb": args.backlog_mb,
        "bound_mb": args.bound_mb,
        "peak_rss_mb": round(peak, 1),
        "rss_over_bound_mb": round(peak - args.bound_mb, 1),
    }


# --------------------------------------------------------------------------------------------
# phase 4: a retrying key


async def retry_cost(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    records = args.retry_records
    rng = random.Random(11)
    keys = [
        b"hot" if rng.random() < 0.1 else b"key-%d" % rng.randrange(100) for _ in range(records)
    ]
    others = sum(key != b"hot" for key in keys)
    topic = await new_topic(stack, keys)
    costs: list[float] = []
    for round_ in range(args.rounds):
        # Plain first in even rounds, retrying first in odd ones: a drift of the machine's
        # speed within a round weighs on both sides alike over the rounds.
        order = (False, True) if round_ % 2 == 0 else (True, False)
        rates = {
            failing: await _other_keys_rate(stack, args, topic, others, failing)
            for failing in order
        }
        costs.append(1 - rates[True] / rates[False])
        log(f"retrying key: other keys {rates[False]:.0f} plain, {rates[True]:.0f} with retries")
    return {"retry_cost": round(statistics.median(costs), 3)}


async def _other_keys_rate(
    stack: Stack, args: argparse.Namespace, topic: str, others: int, failing: bool
) -> float:
    failures: dict[int, int] = defaultdict(int)
    counter = Counter(others)

    async def handle(record: Any) -> None:
        if record.key == b"hot" and failing and failures[record.offset] < 2:
            failures[record.offset] += 1
            raise ConnectionError("hot key downstream is flaky")
        await asyncio.sleep(work_of(record.offset))
        if record.key != b"hot":
            counter.count_one()

    settings = config(
        stack,
        topic,
        max_concurrency=args.concurrency,
        failure_policy="retry",
        max_attempts=3,
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.05,
    )
    await run_until(Worker(settings, handler=handle), counter.done)
    return others / (counter.last - counter.first)


# --------------------------------------------------------------------------------------------
# phase 5: what tracing costs


async def tracing_cost(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    summary: dict[str, Any] = {}
    for name, keys in (
        ("100", uniform_keys(args.records, 100, seed=100)),
        ("zipf", zipf_keys(args.records, 1_000, 1.0, seed=7)),
    ):
        topic = await new_topic(stack, keys)
        ratios: list[float] = []
        for round_ in range(args.rounds):
            efficiency: dict[bool, float] = {}
            for traced in (False, True) if round_ % 2 == 0 else (True, False):
                # Read when the runtime starts: the off switch every runtime honours.
                os.environ["OTEL_SDK_DISABLED"] = "false" if traced else "true"
                clock = Clock(args.records)
                settings = config(stack, topic, max_concurrency=args.concurrency)
                await run_until(Worker(settings, handler=clock.handle), clock.done)
                efficiency[traced] = clock.figures(args.concurrency)["efficiency"]
                provider.force_flush()
                exporter.clear()
            ratios.append(efficiency[True] / efficiency[False])
            log(
                f"tracing, {name} keys: efficiency {efficiency[False]:.3f} off, "
                f"{efficiency[True]:.3f} on"
            )
        summary[f"traced_efficiency_ratio_{name}"] = round(statistics.median(ratios), 3)
    os.environ.pop("OTEL_SDK_DISABLED", None)
    return summary


# --------------------------------------------------------------------------------------------


async def run(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {"records": args.records, "concurrency": args.concurrency}
    if "pc" in args.phases:
        summary.update(await parallel_consumer(stack, args))
    if "cpu" in args.phases:
        summary.update(await cpu_bound(stack, args))
    if "memory" in args.phases:
        summary.update(await memory(stack, args))
    if "retry" in args.phases:
        summary.update(await retry_cost(stack, args))
    if "tracing" in args.phases:
        summary.update(await tracing_cost(stack, args))
    return summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--baseline-records", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--subpartitions", type=int, default=100)
    parser.add_argument("--cpu-records", type=int, default=4_000)
    parser.add_argument("--cpu-concurrency", type=int, default=16)
    parser.add_argument("--backlog-mb", type=int, default=1_024)
    parser.add_argument("--bound-mb", type=int, default=64)
    parser.add_argument("--memory-seconds", type=float, default=20.0)
    parser.add_argument("--retry-records", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--phases",
        type=lambda text: set(text.split(",")),
        default={"pc", "cpu", "memory", "retry", "tracing"},
        help="comma-separated subset of pc,cpu,memory,retry,tracing",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # The retry phase fails records on purpose; its warnings would drown the phase lines.
    logging.getLogger("client.worker").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="keyrange-bench-workers-") as work:
        stack = Stack(
            Path(work),
            database="bench_workers",
            port=free_port(),
            coordinator_settings=COORDINATOR_SETTINGS,
        )
        with stack:
            log(f"coordinator {stack.coordinator_url}, broker {stack.bootstrap}")
            summary = asyncio.run(run(stack, args))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
