"""Commit throughput of the offset store, three ways in one run against one database.

(a) HTTP commits/s through one coordinator process (``python -m coordinator serve``);
(b) the same commits applied in-process through the storage layer as the route applies them
    (``CommitBatcher.submit``, group commit), no HTTP, no JSON;
(c) raw asyncpg single-row ``UPDATE`` transactions/s: the database's own ceiling.

``service_ratio = a / b`` says what HTTP, validation and serialisation cost on top of storage;
``storage_ratio = b / c`` says how close a commit's transaction gets to the database's own
single-statement rate. Both are measured at the same concurrency, so neither depends on how
fast this machine is.

Workload (the shape Keyrange clients send): ``--committers`` concurrent committers (64) over
``--partitions`` partitions (2,000) of one group; each commit carries 4 partitions, each with
one key-range watermark and two IC ranges. Committers come in pairs sharing a block of
partitions, each owning one half of the key space of every partition in the block, as
Keyrange members share partitions by key range; so a partition row is written by two
committers and its stored state holds real watermark pieces and IC ranges, and rows are
occasionally contended as in production. A committer walks its block four partitions at a time
(its pair partner starts half a block further on); each visit raises the slice's watermark by
10 and reports two out-of-order completions above it, which the next visit's watermark covers.
Every request therefore changes the stored state: none hits the duplicate shortcut.

The load generator is cheaper than the server: raw asyncio streams, one keep-alive HTTP/1.1
connection per committer, request bytes built by ``%`` formatting into pre-serialised
fragments, and replies checked by byte search. Its CPU share is reported.

The three phases run in turn, ``--rounds`` times, so whatever else the machine does weighs on
the three figures alike; each figure is taken over all its rounds. Prints one line per round
and per figure, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import asyncpg
import httpx
import psutil
import uvloop
from sqlalchemy.engine import make_url

from bench.commit_phases import (
    TOPIC,
    CpuMeter,
    PhaseResult,
    difference,
    http_worker,
    local_batch_totals,
    make_committers,
    merge_rounds,
    raw_worker,
    run_phase,
    server_batch_totals,
    storage_worker,
)
from bench.commit_phases import percentile as percentile  # the other benchmarks import it here
from coordinator import migrate
from coordinator.app import tune_gc_for_serving
from coordinator.db.engine import make_engine
from coordinator.offsets.batching import CommitBatcher
from coordinator.offsets.schemas import CommitRequest
from coordinator.settings import Settings

BENCH_DIR = Path(__file__).resolve().parent

SERVE = [sys.executable, "-m", "coordinator", "serve"]
# Issue 29's goals: a commit's Python cost halved shows as storage_ratio and p99_ms.
GOALS = {"service_ratio": 0.6, "storage_ratio": 0.45, "p99_ms": 30.0}
SERVER_START_TIMEOUT_S = 60.0
# Storage commits are pre-parsed before their phase; this many per committer and second of
# the HTTP rate covers a storage layer several times faster than HTTP.
PREPARSE_HEADROOM = 4.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def coordinator_process(
    command: list[str], database_url: str, port: int, log_path: Path
) -> Iterator[psutil.Process]:
    """The coordinator as operators run it, on a loopback port, without auth or Kafka use."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_TOKENS")}
    env.update(
        KEYRANGE_DATABASE_URL=database_url,
        KEYRANGE_PORT=str(port),
        KEYRANGE_HOST="127.0.0.1",
        KEYRANGE_MIGRATE_ON_START="false",
        KEYRANGE_LOG_LEVEL=env.get("KEYRANGE_LOG_LEVEL", "WARNING"),
        # Commits never talk to Kafka; a bootstrap keeps `serve` from starting a broker.
        KEYRANGE_KAFKA_BOOTSTRAP=env.get("KEYRANGE_KAFKA_BOOTSTRAP", "127.0.0.1:9"),
    )
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=BENCH_DIR.parent,
        )
    try:
        wait_until_ready(process, port, log_path)
        yield psutil.Process(process.pid)
    except Exception:
        # The log lives in a directory removed on exit: show why the coordinator failed.
        print(f"coordinator log:\n{log_path.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        raise
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def wait_until_ready(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"coordinator exited early:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"coordinator not ready in time:\n{log_path.read_text()[-3000:]}")


# --------------------------------------------------------------------------------------------
# Profiling


def py_spy_path() -> str | None:
    beside_python = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside_python) if beside_python.exists() else None)


async def profile_process(pid: int, seconds: float, output: Path) -> None:
    """Sample ``pid`` with py-spy (non-blocking, 100 Hz) into collapsed stacks."""
    process = await asyncio.create_subprocess_exec(
        py_spy_path() or "py-spy",
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, int(seconds))),
        "--rate",
        "100",
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(output),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, error = await process.communicate()
    if process.returncode != 0:
        print(f"py-spy failed: {error.decode()[-500:]}", file=sys.stderr)


def profiler(
    directory: Path | None, pid: int, name: str, seconds: float
) -> Callable[[], Awaitable[None]] | None:
    if directory is None:
        return None
    output = directory / name

    async def sample() -> None:
        await profile_process(pid, seconds, output)

    return sample


OUR_PACKAGES = ("coordinator/", "client/", "bench/")


def _location(frame: str) -> str:
    """``function (path:line)`` -> ``path``."""
    return frame[frame.rfind("(") + 1 :].rsplit(":", 1)[0]


def _package_of(frame: str) -> str:
    """The library (or our module) a frame belongs to."""
    location = _location(frame)
    if "site-packages/" in location:
        return location.split("site-packages/", 1)[1].split("/")[0].split(".")[0]
    for package in OUR_PACKAGES:
        if location.startswith(package) or f"/{package}" in location:
            return package + location.split(f"{package}", 1)[1]
    if "/lib/python3" in location:
        return "stdlib:" + location.rsplit("/", 1)[1].removesuffix(".py")
    return location or frame


def _is_ours(frame: str) -> bool:
    location = _location(frame)
    return any(location.startswith(p) or f"/{p}" in location for p in OUR_PACKAGES)


def _label(frame: str) -> str:
    return f"{frame.split(' (')[0]} [{_package_of(frame)}]"


def summarize_profile(path: Path, top: int = 12) -> str:
    """Self time by package and by function, and inclusive time of our own frames."""
    by_package: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        by_package[_package_of(frames[-1])] += count
        by_function[_label(frames[-1])] += count
        for name in {_label(f) for f in frames if _is_ours(f)}:
            inclusive[name] += count
    if not total:
        return "no samples"

    def table(counter: Counter[str], rows: int) -> str:
        return "\n".join(
            f"  {100 * n / total:5.1f}%  {name}" for name, n in counter.most_common(rows)
        )

    return (
        f"{total} busy samples\nself time by package:\n{table(by_package, top)}\n"
        f"self time by function:\n{table(by_function, top)}\n"
        f"inclusive time of our frames:\n{table(inclusive, 2 * top)}"
    )


# --------------------------------------------------------------------------------------------
# Database


@contextlib.contextmanager
def bench_database(work_dir: Path) -> Iterator[tuple[str, str]]:
    """(url, kind): KEYRANGE_BENCH_DATABASE_URL if set, else a fresh embedded Postgres."""
    override = os.environ.get("KEYRANGE_BENCH_DATABASE_URL")
    if override:
        yield override, "override"
        return
    from coordinator.embedded import EmbeddedPostgres

    with EmbeddedPostgres(work_dir / "postgres") as postgres:
        postgres.start()
        yield postgres.create_database("keyrange_bench"), "embedded"


async def seed_raw_group(pool: asyncpg.Pool, group_id: str, partitions: int) -> None:
    async with pool.acquire() as connection:
        await connection.execute("INSERT INTO groups (group_id) VALUES ($1)", group_id)
        await connection.execute(
            "INSERT INTO partition_offsets (group_id, topic, partition) "
            "SELECT $1, $2, p FROM generate_series(0, $3 - 1) AS p",
            group_id,
            TOPIC,
            partitions,
        )


async def find_postmaster(database_url: str) -> psutil.Process | None:
    """The server process whose backends we meter, when the database runs on this machine."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        backend = await connection.fetchval("SELECT pg_backend_pid()")
        # Asked while connected: the backend exits with the connection.
        return psutil.Process(backend).parent()
    except psutil.Error:
        return None
    finally:
        await connection.close()


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    return (
        make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)
    )


# --------------------------------------------------------------------------------------------
# Main


def cpu_ms_per_op(result: PhaseResult, process: str) -> float | None:
    cores = result.cpu_cores.get(process)
    if cores is None or not result.rate:
        return None
    return round(1000 * cores / result.rate, 3)


def foreign_load(cpu_cores: dict[str, float]) -> float:
    return cpu_cores["machine"] - sum(v for k, v in cpu_cores.items() if k != "machine")


def describe(result: PhaseResult) -> str:
    cpu = " ".join(f"{name}={cores:.2f}" for name, cores in result.cpu_cores.items())
    line = (
        f"{result.name}: {result.rate:,.0f}/s p50={result.p50_ms:.1f}ms "
        f"p99={result.p99_ms:.1f}ms failed={result.failed} "
        f"partition_errors={result.partition_errors} cpu_cores[{cpu}]"
    )
    for reason, count in result.failures.most_common(3):
        line += f"\n    {count}x {reason}"
    return line


async def run(args: argparse.Namespace, database_url: str, work_dir: Path) -> dict[str, object]:
    profile_dir = Path(args.profile) if args.profile else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    commit_group = f"bench-commit-{run_id}"
    raw_group = f"bench-raw-{run_id}"
    committers = make_committers(args.committers, args.partitions, args.partitions_per_commit)
    me = psutil.Process()

    def this_process() -> list[psutil.Process]:
        return [me]

    postmaster = await find_postmaster(database_url)

    def postgres() -> list[psutil.Process]:
        if postmaster is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [postmaster, *postmaster.children()]
        return []

    settings = Settings()
    port = free_port()
    command = shlex.split(args.server_command) if args.server_command else SERVE
    rounds: dict[str, list[PhaseResult]] = {"http": [], "storage": [], "raw": []}
    parsed_late = [0]
    batch_totals: dict[str, list[tuple[float, float]]] = {"http": [], "storage": []}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            coordinator_process(command, database_url, port, work_dir / "coordinator.log")
        )
        engine = make_engine(database_url, settings)
        batcher = CommitBatcher(engine, settings)
        batcher.start()
        pool = await asyncpg.create_pool(
            asyncpg_dsn(database_url), min_size=args.committers, max_size=args.committers
        )
        try:
            await seed_raw_group(pool, raw_group, args.partitions)
            http_meter = CpuMeter(
                {"generator": this_process, "server": lambda: [server], "postgres": postgres}
            )
            local_meter = CpuMeter({"bench": this_process, "postgres": postgres})
            # Rounds of (a), (b), (c) in turn: whatever else the machine (or its host) does
            # during the run weighs on the three figures alike, not on one phase.
            for number in range(args.rounds):
                profiled = profile_dir if number == 0 else None
                http_batches_before = await server_batch_totals(port)
                http_round = await run_phase(
                    "http",
                    [http_worker(c, port, commit_group) for c in committers],
                    args.warmup,
                    args.duration,
                    http_meter,
                    profiler(profiled, server.pid, "server.txt", args.duration),
                )
                rounds["http"].append(http_round)
                batch_totals["http"].append(
                    difference(await server_batch_totals(port), http_batches_before)
                )
                # Pre-parse enough commits that parsing stays outside the measured loop.
                expected = max([r.rate for r in rounds["storage"]] + [http_round.rate, 100.0])
                per_committer = max(
                    50,
                    int((args.warmup + args.duration) * expected * PREPARSE_HEADROOM)
                    // len(committers),
                )
                requests = [
                    [CommitRequest.model_validate_json(c.next_body()) for _ in range(per_committer)]
                    for c in committers
                ]
                tune_gc_for_serving()  # as the coordinator does once it has started
                storage_batches_before = local_batch_totals()
                rounds["storage"].append(
                    await run_phase(
                        "storage",
                        [
                            storage_worker(r, c, batcher, commit_group, parsed_late)
                            for r, c in zip(requests, committers, strict=True)
                        ],
                        args.warmup,
                        args.duration,
                        local_meter,
                        profiler(profiled, os.getpid(), "storage.txt", args.duration),
                    )
                )
                batch_totals["storage"].append(
                    difference(local_batch_totals(), storage_batches_before)
                )
                del requests
                rounds["raw"].append(
                    await run_phase(
                        "raw",
                        [raw_worker(c, pool, raw_group) for c in committers],
                        args.warmup,
                        args.duration,
                        local_meter,
                    )
                )
                print(
                    f"round {number + 1}/{args.rounds}: "
                    + " ".join(f"{name}={r[-1].rate:,.0f}/s" for name, r in rounds.items()),
                    flush=True,
                )
        finally:
            await pool.close()
            await batcher.close()
            await engine.dispose()
    http, storage, raw = (merge_rounds(rounds[name]) for name in ("http", "storage", "raw"))
    per_transaction = {
        name: round(sum(r for r, _ in totals) / max(sum(t for _, t in totals), 1.0), 1)
        for name, totals in batch_totals.items()
    }
    print(describe(http) + f" commits_per_transaction={per_transaction['http']}", flush=True)
    print(
        describe(storage)
        + f" parsed_in_loop={parsed_late[0]} commits_per_transaction={per_transaction['storage']}",
        flush=True,
    )
    print(describe(raw), flush=True)
    if profile_dir:
        summary = summarize_profile(profile_dir / "server.txt")
        print(f"coordinator profile under HTTP load:\n{summary}", flush=True)
        summary = summarize_profile(profile_dir / "storage.txt")
        print(f"storage layer profile:\n{summary}", flush=True)

    service_ratio = http.rate / storage.rate if storage.rate else 0.0
    storage_ratio = storage.rate / raw.rate if raw.rate else 0.0
    http_cpu = http.cpu_cores
    summary: dict[str, object] = {
        "http_commits_per_s": round(http.rate, 1),
        "storage_commits_per_s": round(storage.rate, 1),
        "raw_tx_per_s": round(raw.rate, 1),
        "service_ratio": round(service_ratio, 3),
        "storage_ratio": round(storage_ratio, 3),
        "p50_ms": round(http.p50_ms, 2),
        "p99_ms": round(http.p99_ms, 2),
        "storage_p50_ms": round(storage.p50_ms, 2),
        "storage_p99_ms": round(storage.p99_ms, 2),
        "http_commits_per_transaction": per_transaction["http"],
        "storage_commits_per_transaction": per_transaction["storage"],
        "raw_p99_ms": round(raw.p99_ms, 2),
        "generator_cpu_share": round(http_cpu["generator"] / max(http_cpu["machine"], 1e-9), 3),
        # CPU per commit does not depend on how much of the machine this run was given.
        "server_cpu_ms_per_commit": cpu_ms_per_op(http, "server"),
        "storage_cpu_ms_per_commit": cpu_ms_per_op(storage, "bench"),
        "postgres_cpu_ms_per_http_commit": cpu_ms_per_op(http, "postgres"),
        "postgres_cpu_ms_per_storage_commit": cpu_ms_per_op(storage, "postgres"),
        "postgres_cpu_ms_per_raw_tx": cpu_ms_per_op(raw, "postgres"),
        # Cores busy with other work on the machine: the run shares it.
        "foreign_load_cores": {
            phase.name: round(foreign_load(phase.cpu_cores), 2) for phase in (http, storage, raw)
        },
        "errors": http.failed + storage.failed + raw.failed,
        "partition_errors": http.partition_errors + storage.partition_errors,
        "committers": args.committers,
        "partitions": args.partitions,
        "partitions_per_commit": args.partitions_per_commit,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "db_pool": settings.db_pool_size + settings.db_max_overflow,
        "goals_met": (
            service_ratio >= GOALS["service_ratio"]
            and storage_ratio >= GOALS["storage_ratio"]
            and http.p99_ms <= GOALS["p99_ms"]
        ),
    }
    return summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--duration", type=float, default=6.0, help="measured seconds per phase and round"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the three phases, run in turn"
    )
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="unmeasured seconds per phase and round"
    )
    parser.add_argument("--committers", type=int, default=64, help="concurrent committers (even)")
    parser.add_argument("--partitions", type=int, default=2000)
    parser.add_argument("--partitions-per-commit", type=int, default=4)
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="sample the coordinator during (a) and this process during (b) with py-spy; "
        "write collapsed stacks under DIR and print summaries (sampling costs throughput)",
    )
    parser.add_argument(
        "--server-command",
        help="command starting the coordinator for (a), configured through the usual "
        "KEYRANGE_* variables (default: python -m coordinator serve); for comparing variants",
    )
    args = parser.parse_args()
    if args.profile and not py_spy_path():
        parser.error("--profile needs py-spy (pip install py-spy, part of the dev extra)")
    if args.rounds < 1 or args.duration <= 0:
        parser.error("--rounds must be at least 1 and --duration positive")
    if args.committers < 2 or args.committers % 2:
        parser.error("--committers must be even: committers share partitions in pairs")
    block = args.partitions // (args.committers // 2)
    if block < args.partitions_per_commit:
        parser.error("each pair of committers needs at least --partitions-per-commit partitions")
    return args


def main() -> None:
    args = parse_args()
    work_dir = Path(tempfile.mkdtemp(prefix="keyrange-bench-commit-"))
    try:
        with bench_database(work_dir) as (database_url, kind):
            migrate.upgrade(database_url)
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                summary = runner.run(run(args, database_url, work_dir))
            summary["database"] = kind
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
