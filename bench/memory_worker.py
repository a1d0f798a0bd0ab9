"""The worker process of ``bench.workers``' memory phase: a slow handler over a large
backlog. Its own module, importing only the client, so its RSS is a worker's as users run
it (``keyrange worker`` needs only ``pip install keyrange``), not the benchmark's, which
imports the coordinator and its server packages (about 55 MB more) to run the stack."""

from __future__ import annotations

import argparse
import asyncio
import logging
import uuid
from typing import Any

from client.worker import Worker, WorkerConfig


async def slow(record: Any) -> None:
    await asyncio.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("--bootstrap", "--coordinator", "--topic"):
        parser.add_argument(option, required=True)
    parser.add_argument("--bound-mb", type=int, required=True)
    args = parser.parse_args()
    logging.getLogger("client.worker").setLevel(logging.ERROR)
    settings = WorkerConfig(
        topics=[args.topic],
        group_id=f"bench-memory-{uuid.uuid4().hex[:6]}",
        bootstrap_servers=args.bootstrap,
        coordinator_url=args.coordinator,
        max_concurrency=16,
        max_buffered_bytes=args.bound_mb * 1024 * 1024,
    )
    asyncio.run(Worker(settings, handler=slow).run(handle_signals=True))


if __name__ == "__main__":
    main()
