"""``make demo``: several cooperative workers share ONE Kafka partition, on this machine.

Starts an embedded Postgres, an embedded broker and the coordinator, creates a one-partition
topic, produces a keyed workload (skewed keys, as real traffic is), and runs ``--workers``
Keyrange members, each a separate process doing ``--work-ms`` of simulated I/O per record
with up to ``--concurrency`` keys at once. Progress is printed every second; the workers stop
once the group's stable offset reaches the end of the partition, with a summary, and the
coordinator and its console stay up for a look at the finished group until Ctrl-C
(``--exit-when-done`` stops everything at once instead). Ctrl-C stops everything cleanly at any
time (workers commit and leave, then the services stop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from client import KeyRange
from coordinator.kafka import ClusterMetadata
from examples.demo_stack import Stack, WorkerProcess, allow_range_fetch, produce, zipf_keys

SPACE = KeyRange.full().size
DEMO_COORDINATOR_SETTINGS = {
    # A stopped or crashed worker's keys move on within a few seconds.
    "session_timeout_min_ms": "1000",
    "session_timeout_default_ms": "6000",
    "heartbeat_interval_ms": "500",
    "reaper_interval_ms": "250",
    "metadata_refresh_ms": "2000",
    "log_format": "text",
}
PROGRESS_INTERVAL_S = 1.0
WORKER_SESSION_TIMEOUT_MS = 6_000


def say(message: str = "") -> None:
    print(message, flush=True)


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen: int = probe.getsockname()[1]
            return chosen
    raise RuntimeError("no free port")


class Demo:
    def __init__(self, args: argparse.Namespace, stack: Stack) -> None:
        self.args = args
        self.stack = stack
        stamp = time.strftime("%H%M%S")
        self.topic = f"orders-{stamp}"
        self.group = f"demo-{stamp}"
        self.workers: list[WorkerProcess] = []
        self.stop = asyncio.Event()
        self.rates: dict[str, float] = {}
        self._last: dict[str, tuple[float, int]] = {}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stop.set)
        await self.prepare()
        log_path = self.stack.data_dir / "workers.log"
        with log_path.open("ab") as worker_log:
            started = time.monotonic()
            try:
                for index in range(self.args.workers):
                    if index and await self.stopped_within(self.args.join_every):
                        break
                    worker = WorkerProcess(f"worker-{index}", self.worker_options())
                    await worker.start(stderr=worker_log)
                    self.workers.append(worker)
                finished = await self.follow(started)
            finally:
                await self.stop_workers()
        elapsed = time.monotonic() - started
        await self.summary(elapsed, finished)
        if not self.stop.is_set() and not self.args.exit_when_done:
            say(f"the console stays up: {self.stack.coordinator_url}/ui/groups/{self.group}")
            say("press Ctrl-C to stop the coordinator, the broker and Postgres")
            await self.stop.wait()

    async def stopped_within(self, seconds: float) -> bool:
        """Wait ``seconds`` unless asked to stop first; True when asked to stop."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        return self.stop.is_set()

    async def prepare(self) -> None:
        args = self.args
        async with ClusterMetadata(self.stack.bootstrap, request_timeout_ms=10_000) as cluster:
            await cluster.create_topic(self.topic, 1)
        await allow_range_fetch(self.stack.coordinator_url, self.topic)
        keys = zipf_keys(args.records, args.keys, args.skew, seed=42)
        await produce(self.stack.bootstrap, self.topic, keys)
        hottest = Counter(keys).most_common(1)[0][1]
        say(
            f"produced {args.records:,} records to {self.topic} (1 partition), "
            f"{args.keys:,} keys, Zipf({args.skew}); the hottest key has {hottest:,} records"
        )
        say(
            f"starting {args.workers} workers in group {self.group}: {args.work_ms:g} ms of "
            f"work per record, up to {args.concurrency} keys at once per worker"
        )
        say(f"  web console:      {self.stack.coordinator_url}/ui/groups/{self.group}")
        say(f"  watch the group:  {self.admin_url()}")
        say(f"  its offsets:      {self.admin_url()}/offsets")
        say(f"  API docs:         {self.stack.coordinator_url}/docs")
        say()
        say(
            "the stable offset is where every record below is processed: the hottest keys'\n"
            "queued records hold it back while the other keys are processed and committed\n"
            "above it (IC ranges, watermarks), so it trails the processed count, then catches up"
        )
        say()

    def worker_options(self) -> list[str]:
        return [
            "--bootstrap",
            self.stack.bootstrap,
            "--coordinator",
            self.stack.coordinator_url,
            "--group",
            self.group,
            "--topic",
            self.topic,
            "--work-ms",
            str(self.args.work_ms),
            "--concurrency",
            str(self.args.concurrency),
            "--session-timeout-ms",
            str(WORKER_SESSION_TIMEOUT_MS),
        ]

    def admin_url(self) -> str:
        return f"{self.stack.coordinator_url}/v1/admin/groups/{self.group}"

    async def follow(self, started: float) -> bool:
        """Print progress until the stable offset reaches the end (True) or a stop request."""
        async with httpx.AsyncClient(timeout=5) as api:
            while not self.stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), PROGRESS_INTERVAL_S)
                offsets = await self.offsets(api)
                self.line(time.monotonic() - started, offsets)
                if offsets.get("stable_offset", 0) >= self.args.records:
                    return True
                if all(not worker.alive for worker in self.workers):
                    say("every worker exited; see the workers' log")
                    return False
        say("\nstopping: workers commit what they processed and leave the group")
        return False

    async def offsets(self, api: httpx.AsyncClient) -> dict[str, Any]:
        with contextlib.suppress(httpx.HTTPError, KeyError, IndexError, ValueError):
            reply = await api.get(f"{self.admin_url()}/offsets")
            if reply.status_code == 200:
                for entry in reply.json()["partitions"]:
                    if entry["topic"] == self.topic and entry["partition"] == 0:
                        return dict(entry)
        return {}

    def line(self, elapsed: float, offsets: dict[str, Any]) -> None:
        now = time.monotonic()
        processed = 0
        rates = []
        for worker in self.workers:
            count = int(worker.status.get("processed", 0))
            processed += count
            then, before = self._last.get(worker.name, (now, 0))
            rate = (count - before) / (now - then) if now > then else 0.0
            self._last[worker.name] = (now, count)
            rates.append(f"w{worker.name.rsplit('-', 1)[-1]} {rate:4.0f}/s")
        stable = offsets.get("stable_offset", 0)
        lag = offsets.get("lag")
        lag_text = "?" if lag is None else f"{lag:,}"
        say(
            f"{elapsed:6.1f}s  processed {processed:>7,}/{self.args.records:,}  "
            f"stable offset {stable:>7,}  lag {lag_text:>7}  |  " + "  ".join(rates)
        )

    async def stop_workers(self) -> None:
        await asyncio.gather(*(worker.stop() for worker in self.workers))

    async def summary(self, elapsed: float, finished: bool) -> None:
        args = self.args
        say()
        say("worker     processed  share of keys  records/s  peak RSS  member id")
        total = 0
        for worker in self.workers:
            status = worker.status
            processed = int(status.get("processed", 0))
            total += processed
            share = self.shares.get(worker.name, 0.0)
            say(
                f"{worker.name:<9} {processed:>10,}  {share:>12.0%}  "
                f"{processed / elapsed:>9.0f}  {status.get('peak_rss_mb', 0):>5.0f} MB  "
                f"{worker.last_member_id or '-'}"
            )
        sequential = args.records * args.work_ms / 1000
        say(
            f"{'total':<9} {total:>10,}  {'':>12}  {total / elapsed:>9.0f}  "
            f"in {elapsed:.1f} s (one in-order consumer: about {sequential:.0f} s of work)"
        )
        if finished:
            say(f"every record processed and committed: the stable offset is {args.records:,}")
        else:
            say("stopped before the end; progress so far is committed")
        say()
        say(f"admin API for this group: {self.admin_url()}")
        say(f"logs: {self.stack.coordinator_log_path}, {self.stack.data_dir / 'workers.log'}")

    @property
    def shares(self) -> dict[str, float]:
        """Each worker's share of the key space when it last held any."""
        return {
            worker.name: sum(KeyRange(*pair).size for pair in worker.last_owned) / SPACE
            for worker in self.workers
        }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--skew", type=float, default=0.6, help="Zipf exponent of the keys")
    parser.add_argument("--work-ms", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--join-every",
        type=float,
        default=0.0,
        help="seconds between worker starts, to watch the key space split in the console",
    )
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="stop the services once the workers are done, instead of waiting for Ctrl-C",
    )
    parser.add_argument("--data-dir", type=Path, default=Path(".keyrange/demo"))
    parser.add_argument("--port", type=int, default=8080, help="preferred coordinator port")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    say("Keyrange demo: one Kafka partition, many cooperative workers")
    say(f"starting embedded Postgres, embedded broker and the coordinator in {args.data_dir} ...")
    stack = Stack(
        args.data_dir.resolve(),
        database="keyrange_demo",
        port=free_port(args.port),
        coordinator_settings=DEMO_COORDINATOR_SETTINGS,
    )
    # Ctrl-C during start-up or shutdown must not leave services behind: the signal only
    # sets a flag there, and the stack is stopped in order below.
    try:
        stack.start()
    except KeyboardInterrupt:
        stack.stop()
        say("interrupted")
        return 130
    except Exception as error:
        stack.stop()
        print(f"demo: could not start the services: {error}", file=sys.stderr)
        return 1
    try:
        say(f"coordinator {stack.coordinator_url}, broker {stack.bootstrap}")
        asyncio.run(Demo(args, stack).run())
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        say("stopping the coordinator, the broker and Postgres")
        stack.stop()
        signal.signal(signal.SIGINT, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
