"""Targets for ``keyrange worker`` in the worker CLI tests: each records what it processed in
the file named by ``WORKER_TEST_JOURNAL``, and blocks on the offsets ``WORKER_TEST_SLOW``
names (one line per event, so the test reads progress without sharing memory)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from client.worker import RecordObserver, WorkerTask


def _note(event: str) -> None:
    with open(os.environ["WORKER_TEST_JOURNAL"], "a") as journal:
        journal.write(event + "\n")


def _slow_seconds(offset: int) -> float:
    slow = os.environ.get("WORKER_TEST_SLOW", "")
    offsets, _, seconds = slow.partition("=")
    return float(seconds) if str(offset) in offsets.split(",") else 0.0


async def handle(record: Any) -> None:
    _note(f"start {record.offset}")
    await asyncio.sleep(_slow_seconds(record.offset))
    _note(f"done {record.offset}")


class Journaling(WorkerTask):
    async def process(self, record: Any, observer: RecordObserver) -> None:
        await handle(record)
        observer.success()

    def close(self) -> None:
        _note("closed")


def in_a_process(record: Any) -> None:
    """A synchronous handler for ``processes``: notes the process it ran in; offset 3 fails
    with an exception that cannot be pickled back (it holds a lock)."""
    if record.offset == 3:
        raise Unpicklable(threading.Lock())
    _note(f"pid {os.getpid()} {record.offset}")


class Unpicklable(Exception):
    pass


NOT_CALLABLE = 42


def dies_once(record: Any) -> None:
    """A synchronous handler for ``processes`` whose process exits at offset 5 the first
    time, as a crash or an out-of-memory kill would end it; notes sizes and processes."""
    marker = os.environ["WORKER_TEST_JOURNAL"] + ".died"
    if record.offset == 5 and not os.path.exists(marker):
        with open(marker, "w") as died:
            died.write(str(os.getpid()))
        os._exit(3)
    _note(f"pid {os.getpid()} {record.offset} {len(record.value)}")


def notes_its_start(record: Any) -> None:
    """A synchronous handler for the session-deadline tests (threads or ``processes``): notes
    the ``time.monotonic()`` at which it started the record (one clock for every process of
    the machine), takes ``WORKER_TEST_SLEEP`` seconds, notes that it is done."""
    _note(f"start {record.offset} {time.monotonic()!r}")
    time.sleep(float(os.environ["WORKER_TEST_SLEEP"]))
    _note(f"done {record.offset}")


def _ledger(event: str, member: str, record: Any) -> None:
    """One line per event, written whole by one ``write`` to a file opened for appending, so
    lines from several processes never mix: event, member, key, offset, wall-clock time."""
    line = f"{event} {member} {record.key.decode()} {record.offset} {time.time()!r}\n"
    fd = os.open(os.environ["WORKER_TEST_JOURNAL"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def slow_keys_stick_on_first(record: Any) -> None:
    """Member "first" in a process: the first record of each key named ``slow-*`` runs for
    ``WORKER_TEST_SLEEP`` seconds (longer than any timeout of the test), the rest at once."""
    _ledger("start", "first", record)
    if record.key.startswith(b"slow-") and record.offset < int(os.environ["WORKER_TEST_FIRST_N"]):
        time.sleep(float(os.environ["WORKER_TEST_SLEEP"]))
    _ledger("end", "first", record)


def never_sticks(record: Any) -> None:
    """Member "second" in a process: every record at once."""
    _ledger("start", "second", record)
    _ledger("end", "second", record)


def dies_at_offset_one(record: Any) -> None:
    """A synchronous handler for ``processes`` whose process exits at offset 1, as a crash
    would end it, with records queued behind it in its pipe."""
    _note(f"start {record.offset}")
    if record.offset == 1:
        os._exit(3)
