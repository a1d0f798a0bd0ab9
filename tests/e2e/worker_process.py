"""A cooperative member in its own process, for tests that kill it with SIGKILL.

Appends each processed offset to ``--out`` (one line, written before the record is marked
processed, so the file lists everything it might have committed) and runs until killed or
its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from client import KeyrangeConsumer


async def main(args: argparse.Namespace) -> None:
    out = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def handle(record: Any) -> None:
        await asyncio.sleep(args.work_ms / 1000)
        os.write(out, b"%d\n" % record.offset)

    async with KeyrangeConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        coordinator_url=args.coordinator,
        group_id=args.group,
        client_id="process-member",
        session_timeout_ms=args.session_timeout_ms,
        auto_commit_interval_ms=200,
    ) as consumer:
        processing = asyncio.create_task(consumer.run(handle, max_concurrency=4))
        stdin_closed = asyncio.create_task(_stdin_closed())
        await asyncio.wait({processing, stdin_closed}, return_when=asyncio.FIRST_COMPLETED)
        stdin_closed.cancel()
        if processing.done():
            processing.result()


async def _stdin_closed() -> None:
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "coordinator", "group", "topic", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--session-timeout-ms", type=int, default=2_000)
    asyncio.run(main(parser.parse_args()))
