"""The process pool for CPU-bound plain handlers: long-lived children, each fed through its own
pair of pipes that the event loop reads and writes directly.

``ProcessPoolExecutor`` moves every call through a feeder thread, a manager thread and a
thread-safe wake-up of the loop; measured with 1 ms handlers on two cores, that plumbing cost
the parent about 0.1 ms of CPU per record (as much as a tenth of a core), taken from the
children it was feeding. Here a batch is one pickle written to a pipe (without blocking: what
the pipe does not take is written when it is writable again) and an outcome list read back by
a loop reader, with no thread in between.

Each child works through its pipe in order, so outcomes come back in the order batches went
out. Records handed out in the same turn of the event loop go together, in batches of half
a process's share of the most records the pool has had at once, each sent to the process
with the fewest records outstanding: a process then has its next batch waiting while it
works, and does not sit idle while the loop hands out more records.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import signal
import struct
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from client.fetcher import Record

logger = logging.getLogger(__name__)

Handler = Callable[[Record], Any]
Outcomes = list[BaseException | None] | None

_HEADER = struct.Struct("!Q")
_READ_SIZE = 1 << 16


class PoolClosed(RuntimeError):
    """The pool was shut down before the record's outcome came back."""


class ProcessDied(RuntimeError):
    """The process running the record ended without reporting its outcome."""


class ProcessPool:
    """``processes`` children running ``handler``; ``run(record)`` resolves with the
    handler's outcome (its exception, or one that survives pickling, when it raised)."""

    def __init__(self, handler: Handler, processes: int) -> None:
        self._handler = handler
        self._count = processes
        self._children: list[_Child] = []
        self._pending: list[tuple[Record, asyncio.Future[None]]] = []
        self._closed = False
        self._waited_by_replaced = 0.0
        self._most_outstanding = 0

    @property
    def waited_s(self) -> float:
        """Seconds the processes waited for records, together: with the pool's share of the
        cores, whether ``max_concurrency`` keeps them fed (or the loop falls behind)."""
        return self._waited_by_replaced + sum(child.waited_s for child in self._children)

    async def run(self, record: Record) -> None:
        if self._closed:
            raise PoolClosed("the process pool was shut down")
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[None] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._send)
        self._pending.append((record, outcome))
        await outcome

    def close(self) -> None:
        """Close the children's pipes (each exits once its current batch is done, when its
        outcomes find the pipe closed) and fail what is outstanding: its records were given
        back, not committed."""
        self._closed = True
        for record_outcome in self._pending:
            _settle(record_outcome[1], PoolClosed("the process pool was shut down"))
        self._pending = []
        for child in self._children:
            child.close(PoolClosed("the process pool was shut down"))
        self._waited_by_replaced = self.waited_s
        self._children = []

    def _send(self) -> None:
        pending, self._pending = self._pending, []
        if self._closed or not pending:
            return
        # Started on first use; a process that died (its records failed) is replaced.
        alive = [child for child in self._children if child.alive]
        self._waited_by_replaced += sum(c.waited_s for c in self._children if not c.alive)
        try:
            loop = asyncio.get_running_loop()
            while len(alive) < self._count:
                alive.append(_Child(self._handler, loop, alive))
        except Exception as error:
            # Nothing can run them; their failure goes to the policy like a handler's.
            logger.exception("a pool process could not be started")
            for _, outcome in pending:
                _settle(outcome, error)
            return
        finally:
            self._children = alive
        # A batch is a share of the most records the pool has had at once: two per process
        # (outcomes of one batch free as many records, which go out again as one batch), so
        # a process has its next batch waiting while it works, and the batches do not shrink
        # to a record each (a write, a wake-up and a reply per record).
        outstanding = sum(child.load() for child in alive) + len(pending)
        self._most_outstanding = max(self._most_outstanding, outstanding)
        size = -(-self._most_outstanding // (2 * self._count))
        for start in range(0, len(pending), size):
            batch = pending[start : start + size]
            child = min(self._children, key=_Child.load)
            outcomes = [outcome for _, outcome in batch]
            try:
                child.send([record for record, _ in batch], outcomes)
            except Exception as error:  # a record that cannot be pickled
                for outcome in outcomes:
                    _settle(outcome, error)


class _Child:
    """One child process and the parent's side of its pipes: the bytes not written yet and
    the outcomes of the batches sent, in order."""

    def __init__(
        self, handler: Handler, loop: asyncio.AbstractEventLoop, siblings: list[_Child]
    ) -> None:
        self._loop = loop
        context = multiprocessing.get_context()
        to_child, self._inbox = context.Pipe(duplex=False)
        self._outbox, from_child = context.Pipe(duplex=False)
        # A forked child inherits the parent's ends of every pipe; it closes them, or a
        # pipe the parent closes would not end for the child holding its other copy.
        parents_ends = [self._inbox, self._outbox]
        for sibling in siblings:
            parents_ends += [sibling._inbox, sibling._outbox]
        # Daemonic: an interpreter exiting does not wait for a handler that still runs.
        self._process: BaseProcess = context.Process(
            target=_serve, args=(handler, to_child, from_child, parents_ends), daemon=True
        )
        try:
            self._process.start()
        finally:
            to_child.close()
            from_child.close()
            if self._process.pid is None:
                self._inbox.close()
                self._outbox.close()
        os.set_blocking(self._inbox.fileno(), False)
        os.set_blocking(self._outbox.fileno(), False)
        self._unsent = bytearray()
        self._writing = False
        self._received = bytearray()
        self._batches: deque[list[asyncio.Future[None]]] = deque()
        self._outstanding = 0
        # Seconds the child waited with nothing to do, as it reported with its outcomes.
        self.waited_s = 0.0
        self._open = True
        loop.add_reader(self._outbox.fileno(), self._read)

    @property
    def alive(self) -> bool:
        return self._open

    def load(self) -> int:
        return self._outstanding

    def send(self, records: list[Record], outcomes: list[asyncio.Future[None]]) -> None:
        if not self._open:
            # It died while this turn's batches went out.
            for outcome in outcomes:
                _settle(outcome, ProcessDied(f"the pool process {self._process.pid} died"))
            return
        payload = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
        self._batches.append(outcomes)
        self._outstanding += len(outcomes)
        waiting = bool(self._unsent)
        self._unsent += _HEADER.pack(len(payload))
        self._unsent += payload
        if not waiting:
            self._write()

    def close(self, error: BaseException) -> None:
        if not self._open:
            return
        self._open = False
        self._loop.remove_reader(self._outbox.fileno())
        if self._writing:
            self._loop.remove_writer(self._inbox.fileno())
        self._inbox.close()
        self._outbox.close()
        while self._batches:
            for outcome in self._batches.popleft():
                _settle(outcome, error)
        self._outstanding = 0

    def _write(self) -> None:
        try:
            written = os.write(self._inbox.fileno(), self._unsent)
        except BlockingIOError:
            written = 0
        except OSError:
            self._died()
            return
        del self._unsent[:written]
        if self._unsent and not self._writing:
            self._loop.add_writer(self._inbox.fileno(), self._write)
            self._writing = True
        elif not self._unsent and self._writing:
            self._loop.remove_writer(self._inbox.fileno())
            self._writing = False

    def _read(self) -> None:
        try:
            data = os.read(self._outbox.fileno(), _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._died()
            return
        received = self._received
        received += data
        start = 0
        while len(received) - start >= _HEADER.size:
            (length,) = _HEADER.unpack_from(received, start)
            end = start + _HEADER.size + length
            if len(received) < end:
                break
            errors: Outcomes
            errors, waited = pickle.loads(received[start + _HEADER.size : end])
            start = end
            self.waited_s += waited
            self._settle_batch(errors)
        del received[:start]

    def _settle_batch(self, errors: Outcomes) -> None:
        outcomes = self._batches.popleft()
        self._outstanding -= len(outcomes)
        if errors is None:
            for outcome in outcomes:
                if not outcome.done():
                    outcome.set_result(None)
            return
        for outcome, error in zip(outcomes, errors, strict=True):
            _settle(outcome, error)

    def _died(self) -> None:
        # Not joined: the loop does not wait for a process that is still on its way out.
        code = self._process.exitcode
        logger.error("a pool process died", extra={"pid": self._process.pid, "exitcode": code})
        self.close(ProcessDied(f"the pool process {self._process.pid} died (exit code {code})"))


def _settle(outcome: asyncio.Future[None], error: BaseException | None) -> None:
    if outcome.done():
        return
    if error is None:
        outcome.set_result(None)
    else:
        outcome.set_exception(error)


# ------------------------------------------------------------------------- in the child


def _serve(
    handler: Handler, inbox: Connection, outbox: Connection, parents: list[Connection]
) -> None:
    """A child's life: read a batch, run the handler on each record, write the outcomes
    (None when every record succeeded), until the parent closes the pipe or goes away."""
    # A Ctrl+C reaches the whole process group; the parent drains and closes the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for end in parents:
        end.close()
    reading, writing = inbox.fileno(), outbox.fileno()
    while True:
        waiting_since = time.perf_counter()
        header = _read_exactly(reading, _HEADER.size)
        if header is None:
            return
        waited = time.perf_counter() - waiting_since
        payload = _read_exactly(reading, _HEADER.unpack(header)[0])
        if payload is None:
            return
        outcomes = _run_batch(handler, pickle.loads(payload))
        reply = pickle.dumps((outcomes, waited), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_all(writing, _HEADER.pack(len(reply)) + reply)
        except BrokenPipeError:
            return


def _run_batch(handler: Handler, records: list[Record]) -> Outcomes:
    errors: list[BaseException | None] = []
    failed = False
    for record in records:
        try:
            handler(record)
            errors.append(None)
        except Exception as error:
            failed = True
            errors.append(_picklable(error))
    return errors if failed else None


def _picklable(error: Exception) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__qualname__}: {error}")
    return error


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = os.read(fd, size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
