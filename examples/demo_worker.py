"""One worker process of the demo and the client benchmark.

``--mode keyrange`` is a cooperative ``KeyrangeConsumer`` group member; ``--mode aiokafka`` is
the baseline, a plain aiokafka group consumer that processes its partition in order. Each
record costs ``--work-ms`` of simulated I/O. The worker talks to whoever started it through
its standard streams: it prints one JSON status line every ``--report-ms`` (and a last one
when it stops), and reads commands from stdin: ``go`` starts processing when started with
``--gate`` (so a benchmark times only processing, not joining), end of input stops it, as do
SIGTERM and SIGINT. Stopping is clean: in-flight records finish, progress is committed and
the member leaves the group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

from client import KeyrangeConsumer

logger = logging.getLogger("examples.demo_worker")

# How long a stopping member may take to finish in-flight records, commit and leave.
_STOP_TIMEOUT_S = 20.0


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.processed = 0
        self.last_at = 0.0
        self.state = "joining"
        self.go = asyncio.Event()
        self.stop = asyncio.Event()
        self.work_s = args.work_ms / 1000
        self._process = psutil.Process()
        self._peak_rss = 0
        self._keyrange: KeyrangeConsumer | None = None
        self._kafka: AIOKafkaConsumer | None = None

    async def handle(self, record: Any) -> None:
        if self.work_s:
            await asyncio.sleep(self.work_s)
        self.processed += 1
        self.last_at = time.time()

    def status(self) -> dict[str, object]:
        rss = self._process.memory_info().rss
        self._peak_rss = max(self._peak_rss, rss)
        owned: list[list[int]] = []
        member_id: str | None = None
        if self._keyrange is not None:
            member_id = self._keyrange.member_id
            for ranges in self._keyrange.assignment().values():
                owned.extend(keys.to_json() for keys in ranges)
        elif self._kafka is not None and self._kafka.assignment():
            owned.append([0, 2**63 - 1])
        return {
            "name": self.args.name,
            "pid": os.getpid(),
            "member_id": member_id,
            "state": self.state,
            "processed": self.processed,
            "last_at": self.last_at,
            "owned": owned,
            "rss_mb": round(rss / 2**20, 1),
            "peak_rss_mb": round(self._peak_rss / 2**20, 1),
        }

    def report(self) -> None:
        sys.stdout.write(json.dumps(self.status()) + "\n")
        sys.stdout.flush()

    async def reporter(self) -> None:
        while True:
            self.report()
            await asyncio.sleep(self.args.report_ms / 1000)

    async def commands(self) -> None:
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            if line.strip() == b"go":
                self.go.set()
        self.stop.set()

    async def run_keyrange(self) -> None:
        args = self.args
        consumer = KeyrangeConsumer(
            args.topic,
            bootstrap_servers=args.bootstrap,
            coordinator_url=args.coordinator,
            group_id=args.group,
            client_id=args.name,
            session_timeout_ms=args.session_timeout_ms,
            auto_commit_interval_ms=args.commit_interval_ms,
        )
        self._keyrange = consumer
        await consumer.start()
        try:
            self.state = "ready"
            if not await self._until_go():
                return
            self.state = "running"
            if args.iterate:
                processing = asyncio.create_task(self._iterate(consumer))
            else:
                processing = asyncio.create_task(
                    consumer.run(self.handle, max_concurrency=args.concurrency)
                )
            await self._until_stopped(processing)
        finally:
            self.state = "stopping"
            await asyncio.wait_for(consumer.stop(), _STOP_TIMEOUT_S)

    async def _iterate(self, consumer: KeyrangeConsumer) -> None:
        async for record in consumer:
            await self.handle(record)

    async def run_aiokafka(self) -> None:
        args = self.args
        consumer = AIOKafkaConsumer(
            bootstrap_servers=args.bootstrap,
            group_id=args.group,
            client_id=args.name,
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=args.commit_interval_ms,
            session_timeout_ms=args.session_timeout_ms,
            heartbeat_interval_ms=max(args.session_timeout_ms // 6, 100),
        )
        self._kafka = consumer
        assigned = _AssignedEvent()
        consumer.subscribe([args.topic], listener=assigned)
        await consumer.start()
        try:
            await _first_of(assigned.wait(), self.stop.wait())
            self.state = "ready"
            if not await self._until_go():
                return
            self.state = "running"

            async def consume() -> None:
                while True:
                    batches = await consumer.getmany(timeout_ms=200)
                    for records in batches.values():
                        for record in records:
                            await self.handle(record)

            await self._until_stopped(asyncio.create_task(consume()))
        finally:
            self.state = "stopping"
            await asyncio.wait_for(consumer.stop(), _STOP_TIMEOUT_S)

    async def _until_go(self) -> bool:
        if not self.args.gate:
            return True
        await _first_of(self.go.wait(), self.stop.wait())
        return not self.stop.is_set()

    async def _until_stopped(self, processing: asyncio.Task[None]) -> None:
        """Until a stop request, or processing ended on its own (then its error is raised)."""
        stop = asyncio.create_task(self.stop.wait())
        await asyncio.wait({processing, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if processing.done():
            processing.result()
            return
        if self._kafka is not None:
            processing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await processing
        else:
            # KeyrangeConsumer.stop() lets started handlers finish and ends run() itself.
            assert self._keyrange is not None
            await asyncio.wait_for(self._keyrange.stop(), _STOP_TIMEOUT_S)
            await asyncio.wait_for(processing, _STOP_TIMEOUT_S)


class _AssignedEvent(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self._assigned = asyncio.Event()

    async def on_partitions_revoked(self, revoked: object) -> None:
        return None

    async def on_partitions_assigned(self, assigned: object) -> None:
        self._assigned.set()

    async def wait(self) -> None:
        await self._assigned.wait()


async def _first_of(*waits: Coroutine[Any, Any, object]) -> None:
    tasks = [asyncio.create_task(wait) for wait in waits]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def main(args: argparse.Namespace) -> int:
    worker = Worker(args)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop.set)
    background = [
        asyncio.create_task(worker.reporter()),
        asyncio.create_task(worker.commands()),
    ]
    try:
        if args.mode == "keyrange":
            await worker.run_keyrange()
        else:
            await worker.run_aiokafka()
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        worker.state = "stopped"
        worker.report()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["keyrange", "aiokafka"], default="keyrange")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--coordinator", default="http://127.0.0.1:8080")
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--name", default=f"worker-{os.getpid()}")
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--session-timeout-ms", type=int, default=3_000)
    parser.add_argument("--commit-interval-ms", type=int, default=500)
    parser.add_argument("--report-ms", type=int, default=250)
    parser.add_argument(
        "--iterate",
        action="store_true",
        help="process with `async for` (one record at a time) instead of run()",
    )
    parser.add_argument("--gate", action="store_true", help="wait for 'go' on stdin")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("KEYRANGE_WORKER_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    sys.exit(asyncio.run(main(parse_args())))
