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

A record waiting in a pipe can outlive the session it was handed out under, so a child
checks the session deadline before each record (``SharedDeadline``) and reports the records
it did not start as ``NotStarted``.
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
from client.worker.deadline import NotStarted, SessionDeadline, SharedDeadline

logger = logging.getLogger(__name__)

Handler = Callable[[Record], Any]
Outcomes = list[BaseException | None] | None

_HEADER = struct.Struct("!Q")
_READ_SIZE = 1 << 16
# How often the loop copies the session deadline to the children while they have records.
# The membership moves the deadline on with each successful heartbeat, at most a third of a
# session apart, so a copy this fresh lies most of a session ahead: children do not reach it
# while the member is healthy. A copy that did fall behind only refuses records, which the
# engine sends again: it costs a round trip, never a record.
_REFRESH_S = 0.1


class PoolClosed(RuntimeError):
    """The pool was shut down before the record's outcome came back."""


class ProcessDied(RuntimeError):
    """The process running the record ended without reporting its outcome."""


class ProcessPool:
    """``processes`` children running ``handler``; ``run(record)`` resolves with the
    handler's outcome (its exception, or one that survives pickling, when it raised), or
    ``NotStarted`` when the record's turn came after ``deadline`` ended its right to start.

    The children's copy of the deadline is written on the event loop: before every batch
    goes out, every ``_REFRESH_S`` while records are out, and at once when the membership
    ends. Not by the membership as each heartbeat succeeds: the pool needs nothing of the
    consumer but the deadline's reader, and the loop that copies it is the loop that
    heartbeats, so a blocked loop or a frozen process stops both alike. The copy then stays
    at the last deadline the member knew, which is where children must stop."""

    def __init__(self, handler: Handler, processes: int, deadline: SessionDeadline) -> None:
        self._handler = handler
        self._count = processes
        self._deadline = deadline
        self._shared = SharedDeadline(multiprocessing.get_context())
        self._refresh: asyncio.TimerHandle | None = None
        self._children: list[_Child] = []
        # Each record with its outcome and the generation it was handed out under.
        self._pending: list[tuple[Record, asyncio.Future[None], int]] = []
        self._closed = False
        self._waited_by_replaced = 0.0
        self._most_outstanding = 0
        deadline.on_end(self._publish)

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
        self._pending.append((record, outcome, self._deadline.generation))
        await outcome

    def close(self) -> None:
        """Close the children's pipes and fail what is outstanding: its records were given
        back, not committed. So a child starts no further record of the batch it works on,
        and exits after the record it is on, when its outcomes find the pipe closed."""
        self._closed = True
        self._shared.publish(self._deadline.generation, float("-inf"))
        if self._refresh is not None:
            self._refresh.cancel()
            self._refresh = None
        for _, outcome, _ in self._pending:
            _settle(outcome, PoolClosed("the process pool was shut down"))
        self._pending = []
        for child in self._children:
            child.close(PoolClosed("the process pool was shut down"))
        self._waited_by_replaced = self.waited_s
        self._children = []

    def _publish(self) -> None:
        if not self._closed:
            self._shared.publish(self._deadline.generation, self._deadline.deadline())

    def _keep_published(self) -> None:
        self._refresh = None
        self._publish()
        if any(child.load() for child in self._children):
            self._refresh = asyncio.get_running_loop().call_later(_REFRESH_S, self._keep_published)

    def _send(self) -> None:
        generation = self._deadline.generation
        pending: list[tuple[Record, asyncio.Future[None]]] = []
        for record, outcome, handed_out_under in self._pending:
            if handed_out_under == generation:
                pending.append((record, outcome))
            else:
                # Lost while it waited for this turn of the loop: it was given back.
                _settle(outcome, NotStarted("the membership ended before the record was sent"))
        self._pending = []
        if self._closed or not pending:
            return
        # Started on first use; a process that died (its records failed) is replaced.
        alive = [child for child in self._children if child.alive]
        self._waited_by_replaced += sum(c.waited_s for c in self._children if not c.alive)
        try:
            loop = asyncio.get_running_loop()
            while len(alive) < self._count:
                alive.append(_Child(self._handler, self._shared, loop, alive))
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
        self._publish()
        for start in range(0, len(pending), size):
            batch = pending[start : start + size]
            child = min(self._children, key=_Child.load)
            outcomes = [outcome for _, outcome in batch]
            try:
                child.send([record for record, _ in batch], outcomes, generation)
            except Exception as error:  # a record that cannot be pickled
                for outcome in outcomes:
                    _settle(outcome, error)
        if self._refresh is None:
            self._refresh = loop.call_later(_REFRESH_S, self._keep_published)


class _Child:
    """One child process and the parent's side of its pipes: the bytes not written yet and
    the outcomes of the batches sent, in order."""

    def __init__(
        self,
        handler: Handler,
        deadline: SharedDeadline,
        loop: asyncio.AbstractEventLoop,
        siblings: list[_Child],
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
            target=_serve,
            args=(handler, deadline, to_child, from_child, parents_ends),
            daemon=True,
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

    def send(
        self, records: list[Record], outcomes: list[asyncio.Future[None]], generation: int
    ) -> None:
        if not self._open:
            # It died while this turn's batches went out.
            for outcome in outcomes:
                _settle(outcome, ProcessDied(f"the pool process {self._process.pid} died"))
            return
        payload = pickle.dumps((generation, records), protocol=pickle.HIGHEST_PROTOCOL)
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
    handler: Handler,
    deadline: SharedDeadline,
    inbox: Connection,
    outbox: Connection,
    parents: list[Connection],
) -> None:
    """A child's life: read a batch, run the handler on each record the deadline lets
    start, write the outcomes (None when every record succeeded), until the parent closes
    the pipe or goes away."""
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
        generation, records = pickle.loads(payload)
        outcomes = _run_batch(handler, records, deadline, generation)
        reply = pickle.dumps((outcomes, waited), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_all(writing, _HEADER.pack(len(reply)) + reply)
        except BrokenPipeError:
            return


def _run_batch(
    handler: Handler, records: list[Record], deadline: SharedDeadline, generation: int
) -> Outcomes:
    errors: list[BaseException | None] = []
    failed = False
    for record in records:
        if not deadline.permits(generation):
            failed = True
            errors.append(NotStarted("the session deadline passed before the record's turn"))
            continue
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
