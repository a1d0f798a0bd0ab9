"""The ownership gate of the streams runtime (docs/design.md §5, the client half): the consumer's
ownership gate (``client.runtime.gate``) as the streams runtime asks it — whether a task's
record may start in user code now, and whether what a task produced may be handed to the
producer now.

A task holds the lease of the slice its key range lies in. A round of a task's processing
enters the gate for the task's whole range (a revocation of any of its keys then waits for
the round to end, a pool thread included), and each record starts only while the lease holds,
the member is not stopping, the session deadline (read on the loop when the round began) has
not passed and the task is active (``TaskState.RUNNING``: neither restoring, nor halted by a
lost membership, nor closing for a revocation). Outputs are handed to
the producer only while the membership is live and the task not halted, asked right before
each hand-over, so a processor call that returns after the deadline (a loop blocked past the
session, a pool thread stuck in I/O) has its outputs dropped: the keys may be another
instance's by then, and a changelog write landing after the heir's would undo its counts.

What no client can prevent is a process frozen between this check and the socket, or the
producer delivering, after the deadline, records it was given before it: docs/streams.md
("Losing a range") and docs/guarantees.md call it the frozen-mid-call case.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiokafka.structs import TopicPartition

from client.runtime.gate import OwnershipGate
from client.runtime.pools.pool import RangeClaim
from client.streams.task import ACTIVE, StreamTask, TaskState


class TaskGate:
    """Built on the consumer's ownership gate, its hand-out guard ``may_hand_out`` (asking it
    notices a passed deadline and halts every task) and ``session_deadline`` (an instant a
    pool thread can compare)."""

    def __init__(
        self,
        gate: OwnershipGate,
        may_hand_out: Callable[[], bool],
        session_deadline: Callable[[], float],
    ) -> None:
        self._gate = gate
        self._may_hand_out = may_hand_out
        self._session_deadline = session_deadline

    def grant(self, task: StreamTask, home: str) -> None:
        """Give a new task the lease of its slice (``home``: its first source topic; the
        stream-join assignor moves co-partitioned topics' ranges together)."""
        task.lease = self._gate.lease_covering(
            TopicPartition(home, task.id.partition), task.id.keys
        )

    @property
    def ownership(self) -> OwnershipGate:
        """The consumer's gate, which the pools ask before a round starts."""
        return self._gate

    def claim(self, task: StreamTask, home: str) -> TaskClaim:
        """What a round of ``task``'s records asks the gate right before it starts, on the
        loop or the pool thread about to run it: its registration for the task's range."""
        return TaskClaim(task, TopicPartition(home, task.id.partition))

    def round_deadline(self) -> float | None:
        """On the loop, as a round begins: the instant before which its records may start,
        or None when none may (the membership is lost, or its deadline just passed)."""
        if not self._may_hand_out():
            return None
        return self._session_deadline()

    def may_start(self, task: StreamTask, deadline: float) -> bool:
        """Whether ``task``'s next record (or punctuation) may start now; safe on a pool
        thread: it reads the state the loop sets and the monotonic clock."""
        lease = task.lease
        return (
            task.state is ACTIVE
            and lease is not None
            and lease.valid
            and not self._gate.closed
            and time.monotonic() < deadline
        )

    def may_send(self, task: StreamTask) -> bool:
        """On the loop, right before each record is handed to the producer: whether what
        ``task`` produced may still go out (docs/design.md §5: nothing after a loss)."""
        return task.state is not TaskState.HALTED and self._may_hand_out()


class TaskClaim(RangeClaim):
    """A round of one task: its range under its lease, and the task it runs."""

    __slots__ = ("task",)

    def __init__(self, task: StreamTask, tp: TopicPartition) -> None:
        super().__init__(task.lease, tp, task.id.keys, task.current_record)
        self.task = task
