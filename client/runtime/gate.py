"""The ownership gate: the one rule every runtime asks right before user code starts a
record (docs/design.md §5, "release means nothing of it runs").

A record may start only while the slice it was handed out under is still this member's:
not revoked since, the membership not lost, the member not leaving, and the session
deadline not passed. The consumer hands each record out with the ``Lease`` of its slice; a
revocation, a loss and a stop end leases at once, on the event loop, before anything else of
the loop runs. Runtimes ask ``enter`` immediately before they call user code, on the loop or
on a pool thread, and ``exit`` when the call is over; the gate then knows which calls of a
slice are in user code, which is what a revocation waits for before it reports the slice
released. Between ``enter`` and ``exit`` a revocation cannot slip in unseen: both take one
lock, so after ``revoke`` returns, the calls it must wait for are exactly those it can see.

Child processes cannot share the lock. The parent enters a record's call when it sends it to
a child and exits it when the child's outcome, or its death, says the call is over; the child
checks a copy of ``revision`` (moved by every revocation, loss and stop) and the session
deadline in shared memory before each record (``client.runtime.pools``), and the parent stops
a child that runs a revoked key.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange, normalize, subtract

Slices = Mapping[TopicPartition, Sequence[KeyRange]]


class Lease:
    """The right to start records of one owned slice, from its grant until a revocation,
    the membership's loss or the member's stop ends it. A partial revocation ends the lease
    of the whole slice and grants the kept part a new one: records handed out under the old
    lease are refused and sent again, never run under a slice they were not handed out
    under."""

    __slots__ = ("keys", "tp", "valid")

    def __init__(self, tp: TopicPartition, keys: KeyRange) -> None:
        self.tp = tp
        self.keys = keys
        self.valid = True

    def __repr__(self) -> str:
        state = "valid" if self.valid else "ended"
        return f"Lease({self.tp.topic}[{self.tp.partition}] {self.keys}, {state})"


@dataclass(eq=False, slots=True)
class Running:
    """A call of user code on a record of ``tp`` with key hash ``hashed``, since ``started``
    (monotonic); or, for a streams task's processing round, on keys ``hashed`` to
    ``last_hash``, with ``current`` telling which record it is on. ``ends`` counts what must
    still happen before the call is over: its return, and for a worker task that may
    acknowledge after returning, the acknowledgement (each is one ``exit``)."""

    tp: TopicPartition
    hashed: int
    offset: int
    started: float
    last_hash: int | None = None
    current: Callable[[], tuple[int, int] | None] | None = None
    ends: int = 1

    @property
    def keys(self) -> KeyRange:
        return KeyRange(self.hashed, self.hashed if self.last_hash is None else self.last_hash)

    def record(self) -> tuple[int, int]:
        """The key hash and offset of the record the call is on."""
        on = None if self.current is None else self.current()
        return (self.hashed, self.offset) if on is None else on

    def running_s(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started


class OwnershipGate:
    """Which records may start in user code now, and which calls are in it."""

    def __init__(self, session_deadline: Callable[[], float]) -> None:
        # The monotonic instant from which nothing may start; reads attributes only, so a
        # pool thread may call it (``Membership.session_deadline``).
        self._session_deadline = session_deadline
        self._lock = threading.Lock()
        self._leases: dict[TopicPartition, list[Lease]] = {}
        self._running: set[Running] = set()
        # Moved by every revocation, loss and stop: child processes compare it with the
        # revision their records were sent under.
        self.revision = 0
        # Moved by every loss or stop: what waited on the old membership's keys stops waiting.
        self.generation = 0
        # The member is stopping: nothing more starts, though what ran may still be flushed.
        self._closed = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        # Told on the event loop after every revocation, loss and stop (a process pool copies
        # the gate to its children then).
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    @property
    def closed(self) -> bool:
        """The member is stopping: no record starts any more."""
        return self._closed

    def start_deadline(self) -> float:
        """The instant from which nothing may start (-inf once the member stops)."""
        return float("-inf") if self._closed else self._session_deadline()

    # ------------------------------------------------------------ ownership (event loop)

    def grant(self, slices: Slices) -> None:
        """Records of ``slices`` may start from now on."""
        with self._lock:
            for tp, ranges in slices.items():
                leases = self._leases.setdefault(tp, [])
                leases.extend(Lease(tp, keys) for keys in normalize(ranges))
                leases.sort(key=lambda lease: lease.keys.start)

    def revoke(self, slices: Slices) -> None:
        """No record of ``slices`` handed out so far may start any more; kept parts of a
        slice cut by the revocation get a lease of their own."""
        with self._lock:
            self.revision += 1
            for tp, ranges in slices.items():
                leases = self._leases.get(tp)
                if not leases:
                    continue
                kept: list[Lease] = []
                for lease in leases:
                    if not any(lease.keys.overlaps(keys) for keys in ranges):
                        kept.append(lease)
                        continue
                    lease.valid = False
                    kept.extend(Lease(tp, rest) for rest in subtract([lease.keys], ranges))
                if kept:
                    kept.sort(key=lambda lease: lease.keys.start)
                    self._leases[tp] = kept
                else:
                    del self._leases[tp]
        self._changed()

    def close(self) -> None:
        """The member is stopping: no record starts any more, while the leases still vouch
        for outputs of what already ran (a final flush) until ``end``."""
        with self._lock:
            self._closed = True
            self.revision += 1
        self._changed()

    def end(self) -> None:
        """The membership is lost or the member leaves: nothing handed out so far may start,
        and nothing of it is this member's any more."""
        with self._lock:
            self.revision += 1
            self.generation += 1
            for leases in self._leases.values():
                for lease in leases:
                    lease.valid = False
            self._leases.clear()
        self._changed()

    # ------------------------------------------------------------ hand-out (event loop)

    def lease(self, tp: TopicPartition, hashed: int) -> Lease | None:
        """The lease a record of ``tp`` with key hash ``hashed`` is handed out under."""
        for lease in self._leases.get(tp, ()):
            if lease.keys.start <= hashed <= lease.keys.end:
                return lease
        return None

    def lease_covering(self, tp: TopicPartition, keys: KeyRange) -> Lease | None:
        """The lease of the slice that holds all of ``keys`` (a streams task's range)."""
        for lease in self._leases.get(tp, ()):
            if lease.keys.start <= keys.start and keys.end <= lease.keys.end:
                return lease
        return None

    # ------------------------------------------------------------ before user code

    def owns(self, lease: Lease | None) -> bool:
        """Whether the slice of ``lease`` is still this member's, by a live membership: what
        ran under it may still go out (outputs handed to a producer); any thread."""
        return lease is not None and lease.valid and time.monotonic() < self._session_deadline()

    def permits(self, lease: Lease | None) -> bool:
        """Whether a record handed out under ``lease`` may start now; any thread."""
        return not self._closed and self.owns(lease)

    def enter(
        self, lease: Lease | None, tp: TopicPartition, hashed: int, offset: int, ends: int = 1
    ) -> Running | None:
        """Asked immediately before user code starts a record, on any thread: the call's
        registration when it may start (give it to ``exit`` when the call is over, once for
        each of its ``ends``), None when it may not (the record goes back to the slice's
        owner, or is sent again)."""
        with self._lock:
            if not self.permits(lease):
                return None
            running = Running(tp, hashed, offset, time.monotonic(), ends=ends)
            self._running.add(running)
            return running

    def enter_range(
        self,
        lease: Lease | None,
        tp: TopicPartition,
        keys: KeyRange,
        current: Callable[[], tuple[int, int] | None],
    ) -> Running | None:
        """``enter`` for a run of records of ``keys`` (a streams task's round): each of its
        records still asks ``permits`` before it starts; a revocation of any of ``keys``
        waits for the whole run."""
        with self._lock:
            if not self.permits(lease):
                return None
            running = Running(tp, keys.start, -1, time.monotonic(), keys.end, current)
            self._running.add(running)
            return running

    def exit(self, running: Running) -> None:
        """One of the ends of the call registered by ``enter`` happened; after the last,
        the call is over. Any thread."""
        with self._lock:
            running.ends -= 1
            if running.ends > 0:
                return
            self._running.discard(running)
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)

    def exit_all(self, calls: Iterable[Running]) -> None:
        """``exit`` of each of ``calls`` under one hold of the lock (a batch's outcomes)."""
        with self._lock:
            for running in calls:
                running.ends -= 1
                if running.ends <= 0:
                    self._running.discard(running)
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)

    # ------------------------------------------------------------ release

    def is_running(self, running: Running) -> bool:
        return running in self._running

    def running_in(self, slices: Slices | None) -> list[Running]:
        """Calls in user code on keys of ``slices`` (every call with None), oldest first."""
        with self._lock:
            calls = [running for running in self._running if slices is None or _in(slices, running)]
        return sorted(calls, key=lambda running: running.started)

    def wake_waiters(self) -> None:
        """Whoever waits in ``until_ended`` looks again (what it waits for changed)."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)

    async def until_ended(self, slices: Slices | None, timeout_s: float | None) -> bool:
        """Until no call of ``slices`` is in user code (True), or ``timeout_s`` (False)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            with self._lock:
                busy = any(slices is None or _in(slices, running) for running in self._running)
                if not busy:
                    return True
                waiter = loop.create_future()
                self._waiters.append((loop, waiter))
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(waiter, remaining)
            except TimeoutError:
                return False


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _in(slices: Slices, running: Running) -> bool:
    ranges = slices.get(running.tp)
    if ranges is None:
        return False
    last = running.hashed if running.last_hash is None else running.last_hash
    return any(keys.start <= last and running.hashed <= keys.end for keys in ranges)


def pieces_of(calls: Iterable[Running], within: Slices) -> dict[TopicPartition, list[KeyRange]]:
    """The keys of ``calls`` that lie in ``within`` (a single hash for a record's call, the
    revoked part of a streams round's range): what a revocation of ``within`` keeps while
    they run, and never a key beside them that the member keeps anyway."""
    pieces: dict[TopicPartition, list[KeyRange]] = {}
    for running in calls:
        for keys in within.get(running.tp, ()):
            piece = running.keys.intersection(keys)
            if piece is not None:
                pieces.setdefault(running.tp, []).append(piece)
    return {tp: normalize(ranges) for tp, ranges in pieces.items()}
