"""What every pool promises (docs/design.md §5, "release means nothing of it runs").

A runtime hands a record (or a task's run of records) to a pool under the lease of its
slice, but user code may start on it much later: it waits for a thread, or sits in a child's
pipe behind the batch the child works on. If its right to start ends meanwhile (the session
deadline passes, its slice is revoked, the membership is lost, the member stops), its key may
be another member's, so a pool asks the ownership gate again immediately before user code
starts, on whatever thread or process runs it. A ``Claim`` is what the call asks the gate
for: one record's key, or a key range for a run of records. How the call ended is the
pool's answer: its result, its exception, ``NotStarted`` (the gate said no, or it was stopped
before it began) or ``Stopped`` (a pool ended it while it ran)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange
from client.runtime.gate import Lease, OwnershipGate, Running


class NotStarted(Exception):
    """A pool did not start the call: when its turn came, its right to start had ended
    (the session deadline passed, its slice revoked or lost, the member stopping), or the
    call was stopped before it started. Not a failure of user code: the record goes back
    to the slice's owner (or is sent again when its slice is still this member's)."""


class Stopped(RuntimeError):
    """A pool ended the call while it ran (``Stoppable.stop``): a loop call cancelled, a
    process killed. Its outcome is unknown; whoever stopped it decides what follows."""


class Claim(Protocol):
    """What a call of user code asks the gate for, right before it starts (for a child
    process, as the parent sends it)."""

    def enter(self, gate: OwnershipGate) -> Running | None:
        """``gate.enter`` (or ``enter_range``) for this call: its registration, or None."""


class Stoppable(Protocol):
    """Where a pool puts how to end the call it runs (cancel a loop call or a queued thread
    call, kill a process), while it can."""

    stop: Callable[[], None] | None


class Pool(Protocol):
    """Where user code runs: the loop, a thread pool, a process pool."""

    async def run(
        self, claim: Claim, slot: Stoppable | None, function: Callable[..., Any], *args: Any
    ) -> Any:
        """``function(*args)`` if the gate lets ``claim`` start when its turn comes
        (``NotStarted`` else), stoppable through ``slot.stop`` while that is set: before it
        starts it then never does (``NotStarted``); running, it ends as ``Stopped`` where
        the pool can end it (the loop, a process) and runs out where it cannot (a thread)."""

    async def until_stopped(self) -> None:
        """Until the calls ended by ``stop`` are over (a killed process has exited)."""

    def close(self) -> None:
        """Start nothing more: what waits for its turn never starts."""


class RecordClaim:
    """One record's call: its key hash and offset under its slice's lease."""

    __slots__ = ("hashed", "lease", "offset", "tp")

    def __init__(self, lease: Lease | None, tp: TopicPartition, hashed: int, offset: int) -> None:
        self.lease = lease
        self.tp = tp
        self.hashed = hashed
        self.offset = offset

    def enter(self, gate: OwnershipGate) -> Running | None:
        return gate.enter(self.lease, self.tp, self.hashed, self.offset)


class RangeClaim:
    """A run of records of ``keys`` (a streams task's round); ``current`` tells which record
    it is on. Each record of the run still asks the gate before it starts; a revocation of
    any of ``keys`` waits for the whole run."""

    __slots__ = ("current", "keys", "lease", "tp")

    def __init__(
        self,
        lease: Lease | None,
        tp: TopicPartition,
        keys: KeyRange,
        current: Callable[[], tuple[int, int] | None],
    ) -> None:
        self.lease = lease
        self.tp = tp
        self.keys = keys
        self.current = current

    def enter(self, gate: OwnershipGate) -> Running | None:
        return gate.enter_range(self.lease, self.tp, self.keys, self.current)


def is_async(function: Callable[..., Any]) -> bool:
    """Whether ``function`` runs on the loop pool (a coroutine function) or off the loop."""
    return inspect.iscoroutinefunction(function)
