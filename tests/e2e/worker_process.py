"""A cooperative member in its own process, for tests that kill it with SIGKILL, freeze it
with SIGSTOP, or block its event loop.

With ``--out`` it appends each processed offset to that file (one line, written before the
record is marked processed, so the file lists everything it might have committed). With
``--ledger`` it appends one JSON line per event instead, on the machine-wide monotonic clock
so a test can line up several processes: ``start`` when a record is handed to the handler
(with the member id it was handed out under) and ``effect`` when the handler acts on it, which
it does only while ``still_owned`` says the record is still this member's. SIGUSR1 makes the
next handler block the event loop for ``--block-ms`` with a synchronous sleep (then a
``blocked`` event). With ``--journal`` it appends a ``boot`` line, then one JSON line at every
handler start and end (``tests.chaos.ledger`` reads them): the chaos suite's ledger, which
outlives a SIGKILL because each line is one ``write`` to a file opened for appending; a few
handlers starting before the instant ``<journal>.control`` names first await as long as it
says (the chaos suite's stuck and long calls; ``tests/chaos/targets.py`` describes the file).
It runs until killed or its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

from client import KeyrangeConsumer, RebalanceListener
from client.http import Slices


class _LossCounter(RebalanceListener):
    """Counts the times the member lost its slices, so the journal tells a record handed out
    before a loss from one handed out after the member rejoined (its member id may stay)."""

    def __init__(self) -> None:
        self.losses = 0

    async def on_slices_lost(self, slices: Slices) -> None:
        self.losses += 1


async def main(args: argparse.Namespace) -> None:
    out = None if args.out is None else _append(args.out)
    ledger = None if args.ledger is None else _append(args.ledger)
    journal = None if args.journal is None else _append(args.journal)
    if journal is not None:
        booted = {"e": "boot", "p": args.name, "t": time.monotonic(), "w": time.time()}
        os.write(journal, json.dumps(booted).encode() + b"\n")
    losses = _LossCounter()
    block_next = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, block_next.set)

    def note(event: dict[str, Any]) -> None:
        if ledger is not None:
            os.write(ledger, json.dumps(event).encode() + b"\n")

    def record_event(event: str, record: Any, **fields: Any) -> None:
        if journal is None:
            return
        line = {
            "e": event,
            "p": args.name,
            "m": consumer.member_id,
            "ep": consumer.member_epoch,
            "g": losses.losses,
            "pt": record.partition,
            "o": record.offset,
            "k": record.key.hex(),
            "t": time.monotonic(),
            "w": time.time(),
            **fields,
        }
        os.write(journal, json.dumps(line).encode() + b"\n")

    async def handle(record: Any) -> None:
        record_event("start", record)
        outcome = "error"
        try:
            await work(record)
            outcome = "done"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            record_event("end", record, ok=outcome)

    async def work(record: Any) -> None:
        started = time.monotonic()
        member = consumer.member_id
        await _control_sleep(args.journal, started)
        note({"e": "start", "m": member, "o": record.offset, "k": record.key.hex(), "t": started})
        if block_next.is_set():
            block_next.clear()
            time.sleep(args.block_ms / 1000)  # noqa: ASYNC251 - the point: a blocked loop
            blocked = {"e": "blocked", "p": args.name, "s": started, "t": time.monotonic()}
            note(blocked)
            if journal is not None:
                os.write(journal, json.dumps(blocked).encode() + b"\n")
        await asyncio.sleep(args.work_ms / 1000)
        if ledger is not None and not consumer.still_owned(record):
            return
        note(
            {
                "e": "effect",
                "m": member,
                "o": record.offset,
                "k": record.key.hex(),
                "s": started,
                "t": time.monotonic(),
            }
        )
        if out is not None:
            os.write(out, b"%d\n" % record.offset)

    async with KeyrangeConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        coordinator_url=args.coordinator,
        group_id=args.group,
        client_id=args.name,
        session_timeout_ms=args.session_timeout_ms,
        auto_commit_interval_ms=200,
        revoke_timeout_s=args.revoke_timeout_s,
        rebalance_listener=losses,
    ) as consumer:
        processing = asyncio.create_task(consumer.run(handle, max_concurrency=args.concurrency))
        stdin_closed = asyncio.create_task(_stdin_closed())
        await asyncio.wait({processing, stdin_closed}, return_when=asyncio.FIRST_COMPLETED)
        stdin_closed.cancel()
        if processing.done():
            processing.result()


async def _control_sleep(journal: str | None, started: float) -> None:
    """``tests/chaos/targets.py`` describes the control file."""
    if journal is None:
        return
    control = f"{journal}.control"
    try:
        with open(control) as file:  # noqa: ASYNC230 - a small local file
            asked = json.load(file)
    except (OSError, ValueError):
        return
    if started >= asked["until"]:
        return
    for index in range(asked["calls"]):
        try:
            os.close(os.open(f"{control}.{asked['id']}.{index}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        await asyncio.sleep(asked["sleep_s"])
        return


def _append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


async def _stdin_closed() -> None:
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "coordinator", "group", "topic"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--out")
    parser.add_argument("--ledger")
    parser.add_argument("--journal")
    parser.add_argument("--name", default="process-member")
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--block-ms", type=float, default=5_000)
    parser.add_argument("--session-timeout-ms", type=int, default=2_000)
    parser.add_argument("--revoke-timeout-s", type=float, default=30.0)
    asyncio.run(main(parser.parse_args()))
