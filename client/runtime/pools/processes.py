"""The process pool for CPU-bound plain functions: long-lived children, each fed through its
own pair of pipes that the event loop reads and writes directly.

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

The gate sees every call a child may run: a record enters it as it is sent (refused, it is
``NotStarted`` at once) and exits once its outcome is back, its process is gone, or a stop made
sure it never starts. A revocation then waits for a child's call, or holds its key, as it does
for a thread's, whatever else it found. A record waiting in a pipe can outlive the right it was
handed out under (the session deadline passed, its slice revoked, the member stopping), so a
child asks the ownership gate's shared copy before each record (``SharedGate``) and reports
the records it did not start as ``NotStarted``. A call that must end now (its key revoked,
its processing timed out, the membership lost) is ended by killing its process: the pool then
knows which of the process's records had started (``ProcessDied``), which was running
(``Stopped``) and which never started (``NotStarted``, sent again without counting an
attempt).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from client.runtime.gate import OwnershipGate, Running
from client.runtime.pools.pool import Claim, NotStarted, Stoppable, Stopped
from client.runtime.pools.shared import ChildProgress, SharedGate

logger = logging.getLogger(__name__)

Function = Callable[..., Any]
# A call as it goes to a child: the function and its arguments, pickled with its batch.
_Call = tuple[Function, tuple[Any, ...]]
Outcomes = list[BaseException | None] | None

_HEADER = struct.Struct("!Q")
# ``map``'s second argument for ``dict.pop``'s default: None for every sequence number.
_NOTHING = itertools.repeat(None)
_READ_SIZE = 1 << 16
# How often the loop copies the session deadline to the children while they have records.
# The membership moves the deadline on with each successful heartbeat, at most a third of a
# session apart, so a copy this fresh lies most of a session ahead: children do not reach it
# while the member is healthy. A copy that did fall behind only refuses records, which the
# runtime sends again: it costs a round trip, never a record.
_REFRESH_S = 0.1


class PoolClosed(RuntimeError):
    """The pool was shut down before the record's outcome came back."""


class ProcessDied(RuntimeError):
    """The process running the record ended without reporting its outcome."""


# Each call sent gets a sequence number; a child notes the one it starts in shared memory.
_Pending = tuple[_Call, asyncio.Future[None], Claim, int]


class ProcessPool:
    """``processes`` children; ``run(claim, slot, function, *args)`` resolves with the
    call's outcome (its exception, or one that survives pickling, when it raised; its
    return value is not sent back), ``NotStarted`` when its turn came after its right to
    start ended, or ``Stopped`` when ``slot.stop()`` ended it by killing its process.
    ``function`` and ``args`` are pickled to the child: a module-level function, and
    arguments that pickle.

    The children's copy of the gate is written on the event loop: before every batch goes
    out, every ``_REFRESH_S`` while records are out, and at once when the gate changes (a
    revocation, a loss, a stop). Not by the membership as each heartbeat succeeds: the pool
    needs nothing of the consumer but the gate, and the loop that copies it is the loop that
    heartbeats, so a blocked loop or a frozen process stops both alike. The copy then stays
    at the last deadline the member knew, which is where children must stop."""

    def __init__(self, processes: int, gate: OwnershipGate) -> None:
        self._count = processes
        self._gate = gate
        self._shared = SharedGate(multiprocessing.get_context())
        self._refresh: asyncio.TimerHandle | None = None
        self._children: list[_Child] = []
        self._pending: list[_Pending] = []
        # The gate's registration of each record sent and not over yet, by sequence number.
        self._running: dict[int, Running] = {}
        self._sequence = 0
        self._closed = False
        self._waited_by_replaced = 0.0
        self._most_outstanding = 0
        gate.on_change(self._publish)

    @property
    def waited_s(self) -> float:
        """Seconds the processes waited for records, together: with the pool's share of the
        cores, whether ``max_concurrency`` keeps them fed (or the loop falls behind)."""
        return self._waited_by_replaced + sum(child.waited_s for child in self._children)

    async def run(
        self, claim: Claim, slot: Stoppable | None, function: Function, *args: Any
    ) -> None:
        if self._closed:
            raise PoolClosed("the process pool was shut down")
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[None] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._send)
        self._sequence += 1
        sequence = self._sequence
        self._pending.append(((function, args), outcome, claim, sequence))
        if slot is None:
            await outcome
            return
        slot.stop = lambda: self._stop(outcome, sequence)
        try:
            await outcome
        finally:
            slot.stop = None

    async def until_stopped(self) -> None:
        """Until every process killed by ``stop`` has exited: their calls are over."""
        dying = [child for child in self._children if child.killed]
        self._children = [child for child in self._children if not child.killed]
        for child in dying:
            await child.exited()

    def _stop(self, outcome: asyncio.Future[None], sequence: int) -> None:
        """End the record's call: not sent yet, it never starts; waiting in a child's pipe,
        the child skips it; running, its process is killed (and replaced on the next send)."""
        for index, pending in enumerate(self._pending):
            if pending[1] is outcome:
                del self._pending[index]
                _settle(outcome, NotStarted("stopped before it was sent"))
                return
        for child in self._children:
            if child.holds(sequence):
                child.stop(sequence)
                return

    def close(self) -> None:
        """Close the children's pipes and fail what is outstanding: its records were given
        back, not committed. So a child starts no further record of the batch it works on,
        and exits after the record it is on, when its outcomes find the pipe closed."""
        self._closed = True
        self._shared.publish(self._gate.revision, float("-inf"))
        if self._refresh is not None:
            self._refresh.cancel()
            self._refresh = None
        for _, outcome, _, _ in self._pending:
            _settle(outcome, PoolClosed("the process pool was shut down"))
        self._pending = []
        for child in self._children:
            child.close(PoolClosed("the process pool was shut down"))
        self._waited_by_replaced = self.waited_s
        self._children = []

    def _publish(self) -> None:
        if not self._closed:
            self._shared.publish(self._gate.revision, self._gate.start_deadline())

    def _keep_published(self) -> None:
        self._refresh = None
        self._publish()
        if any(child.load() for child in self._children):
            self._refresh = asyncio.get_running_loop().call_later(_REFRESH_S, self._keep_published)

    def _ended(self, sequences: Iterable[int]) -> None:
        """The calls of ``sequences`` are over, or never start: out of the gate."""
        running = self._running
        calls = [call for call in map(running.pop, sequences, _NOTHING) if call is not None]
        if calls:
            self._gate.exit_all(calls)

    def _send(self) -> None:
        if self._closed:
            for _, outcome, _, _ in self._pending:
                _settle(outcome, PoolClosed("the process pool was shut down"))
            self._pending = []
            return
        gate, running = self._gate, self._running
        pending: list[_Pending] = []
        for entry in self._pending:
            call = entry[2].enter(gate)
            if call is None:
                # Its right ended while it waited for this turn of the loop: given back.
                _settle(entry[1], NotStarted("its slice was revoked or lost before it was sent"))
            else:
                running[entry[3]] = call
                pending.append(entry)
        self._pending = []
        if not pending:
            return
        # Started on first use; a process that died (its records failed) is replaced.
        alive = [child for child in self._children if child.alive]
        self._waited_by_replaced += sum(c.waited_s for c in self._children if not c.alive)
        try:
            loop = asyncio.get_running_loop()
            while len(alive) < self._count:
                alive.append(_Child(self._shared, loop, alive, self._ended))
        except Exception as error:
            # Nothing can run them; their failure goes to the policy like a handler's.
            logger.exception("a pool process could not be started")
            self._ended(entry[3] for entry in pending)
            for _, outcome, _, _ in pending:
                _settle(outcome, error)
            return
        finally:
            self._children = alive + [child for child in self._children if child.killed]
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
            child = min(alive, key=_Child.load)
            outcomes = [entry[1] for entry in batch]
            try:
                child.send([(entry[3], entry[0]) for entry in batch], outcomes, self._gate.revision)
            except Exception as error:  # a record that cannot be pickled
                self._ended(entry[3] for entry in batch)
                for outcome in outcomes:
                    _settle(outcome, error)
        if self._refresh is None:
            self._refresh = loop.call_later(_REFRESH_S, self._keep_published)


class _Child:
    """One child process and the parent's side of its pipes: the bytes not written yet, the
    outcomes of the batches sent (in order, with each record's sequence number), and the
    shared note of which record the child started last."""

    def __init__(
        self,
        gate: SharedGate,
        loop: asyncio.AbstractEventLoop,
        siblings: list[_Child],
        ended: Callable[[Iterable[int]], None],
    ) -> None:
        self._loop = loop
        # Told of the records whose calls are over or never start (``ProcessPool._ended``).
        self._ended = ended
        context = multiprocessing.get_context()
        to_child, self._inbox = context.Pipe(duplex=False)
        self._outbox, from_child = context.Pipe(duplex=False)
        self._progress = ChildProgress(context)
        # A forked child inherits the parent's ends of every pipe; it closes them, or a
        # pipe the parent closes would not end for the child holding its other copy.
        parents_ends = [self._inbox, self._outbox]
        for sibling in siblings:
            parents_ends += sibling.parents_ends()
        # Daemonic: an interpreter exiting does not wait for a handler that still runs.
        self._process: BaseProcess = context.Process(
            target=_serve,
            args=(gate, self._progress, to_child, from_child, parents_ends),
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
        self._batches: deque[list[tuple[int, asyncio.Future[None]]]] = deque()
        self._outstanding = 0
        # The sequence number of the last record sent: what a stop refuses ends there.
        self._last_sent = -1
        # Seconds the child waited with nothing to do, as it reported with its outcomes.
        self.waited_s = 0.0
        self._open = True
        # Killed by ``stop``; its records get their outcomes once it has exited.
        self.killed = False
        self._exit: asyncio.Future[None] | None = None
        loop.add_reader(self._outbox.fileno(), self._read)

    def parents_ends(self) -> list[Connection]:
        """The parent's ends of this child's pipes, which a sibling forked later closes."""
        return [self._inbox, self._outbox]

    @property
    def alive(self) -> bool:
        return self._open and not self.killed

    def load(self) -> int:
        return self._outstanding

    def holds(self, sequence: int) -> bool:
        return any(seq == sequence for batch in self._batches for seq, _ in batch)

    def send(
        self, records: list[tuple[int, _Call]], outcomes: list[asyncio.Future[None]], revision: int
    ) -> None:
        if not self._open:
            # It died while this turn's batches went out.
            self._ended(sequence for sequence, _ in records)
            for outcome in outcomes:
                _settle(outcome, NotStarted(f"the pool process {self._process.pid} died"))
            return
        payload = pickle.dumps((revision, records), protocol=pickle.HIGHEST_PROTOCOL)
        self._batches.append(
            [(seq, outcome) for (seq, _), outcome in zip(records, outcomes, strict=True)]
        )
        self._outstanding += len(outcomes)
        self._last_sent = max(self._last_sent, records[-1][0])
        waiting = bool(self._unsent)
        self._unsent += _HEADER.pack(len(payload))
        self._unsent += payload
        if not waiting:
            self._write()

    def stop(self, sequence: int) -> None:
        """End the call of record ``sequence``: the child skips it if it has not started it,
        else the child is killed."""
        if self._progress.refuse(sequence, self._last_sent):
            self._ended((sequence,))
            return
        if self.killed:
            return
        self.killed = True
        self._process.kill()
        self._exit = asyncio.ensure_future(self._settle_after_exit(sequence))

    async def exited(self) -> None:
        """Until a killed process is gone and its records have their outcomes."""
        if self._exit is not None:
            await asyncio.shield(self._exit)

    async def _settle_after_exit(self, sequence: int) -> None:
        """Outcomes only once the process is gone: until then its call may still run. Its
        sentinel turns readable when it has exited; the loop must not block on ``join``."""
        exited: asyncio.Future[None] = self._loop.create_future()
        sentinel = self._process.sentinel
        self._loop.add_reader(sentinel, _settle, exited, None)
        try:
            await exited
        finally:
            self._loop.remove_reader(sentinel)
        self._process.join(0)
        logger.info(
            "a pool process killed to end a call has exited",
            extra={"pid": self._process.pid},
        )
        self._finish(sequence, stopped=True)

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
            batch = self._batches.popleft()
            self._ended(sequence for sequence, _ in batch)
            for _, outcome in batch:
                _settle(outcome, error)
        self._outstanding = 0

    def _finish(self, running: int | None, *, stopped: bool) -> None:
        """The child is gone with batches outstanding: the records it had started before the
        last one ran (their outcome is lost), the last one was running (``Stopped`` when we
        killed it), and the rest never started."""
        started = self._progress.started()
        pid, code = self._process.pid, self._process.exitcode
        outcomes = [entry for batch in self._batches for entry in batch]
        self._batches.clear()
        self.close(NotStarted(f"the pool process {pid} ended before the record's turn"))
        self._ended(seq for seq, _ in outcomes)
        for seq, outcome in outcomes:
            if seq > started:
                _settle(outcome, NotStarted(f"the pool process {pid} ended before its turn"))
            elif stopped and seq == running:
                _settle(outcome, Stopped(f"the call was ended by killing process {pid}"))
            else:
                _settle(outcome, ProcessDied(f"the pool process {pid} died (exit code {code})"))

    def _write(self) -> None:
        try:
            written = os.write(self._inbox.fileno(), self._unsent)
        except BlockingIOError:
            written = 0
        except OSError:
            if self.killed:
                self._loop.remove_writer(self._inbox.fileno())
                self._writing = False
            else:
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
            if self.killed:
                self._loop.remove_reader(self._outbox.fileno())
            else:
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
        self._ended(sequence for sequence, _ in outcomes)
        if errors is None:
            for _, outcome in outcomes:
                if not outcome.done():
                    outcome.set_result(None)
            return
        for (_, outcome), error in zip(outcomes, errors, strict=True):
            _settle(outcome, error)

    def _died(self) -> None:
        # Not joined: the loop does not wait for a process that is still on its way out.
        logger.error(
            "a pool process died",
            extra={"pid": self._process.pid, "exitcode": self._process.exitcode},
        )
        self._finish(None, stopped=False)


def _settle(outcome: asyncio.Future[None], error: BaseException | None) -> None:
    if outcome.done():
        return
    if error is None:
        outcome.set_result(None)
    else:
        outcome.set_exception(error)


# ------------------------------------------------------------------------- in the child


def _serve(
    gate: SharedGate,
    progress: ChildProgress,
    inbox: Connection,
    outbox: Connection,
    parents: list[Connection],
) -> None:
    """A child's life: read a batch, run each call the gate lets start, write the outcomes
    (None when every call succeeded), until the parent closes the pipe or goes away."""
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
        revision, records = pickle.loads(payload)
        outcomes = _run_batch(records, gate, progress, revision)
        reply = pickle.dumps((outcomes, waited), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_all(writing, _HEADER.pack(len(reply)) + reply)
        except BrokenPipeError:
            return


def _run_batch(
    calls: list[tuple[int, _Call]],
    gate: SharedGate,
    progress: ChildProgress,
    revision: int,
) -> Outcomes:
    errors: list[BaseException | None] = []
    failed = False
    for sequence, (function, args) in calls:
        if not progress.start(sequence, gate, revision):
            failed = True
            errors.append(NotStarted("its right to start ended before its turn"))
            continue
        try:
            function(*args)
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
