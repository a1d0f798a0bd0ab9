"""The ownership gate as a pool's child processes see it (docs/design.md §5). A child cannot
take the gate's lock, so before each record it reads a copy in shared memory (``SharedGate``)
that the parent's event loop writes, and notes which record it starts (``ChildProgress``) so
the parent can stop a call that has not started without killing the process."""

from __future__ import annotations

import time
from multiprocessing.context import BaseContext
from typing import Any

# No record has this sequence number: nothing is refused.
_NONE_REFUSED = 2**62


class SharedGate:
    """The gate as child processes see it: the revision the gate is at and the instant from
    which nothing may start, in shared memory, written by the parent's event loop, read by a
    child before each record. A record sent under an older revision is refused (a revocation,
    a loss or a stop happened since; the parent sends it again if its slice is still ours).

    The children compare the deadline with their own ``time.monotonic()``, which is
    CLOCK_MONOTONIC on Linux: one clock for every process of the machine (of one time
    namespace, which forked and spawned children share), so an instant means the same in
    parent and child.

    No lock: the parent is the only writer, and each value is one aligned double. The parent
    writes the revision before the deadline and a child reads the deadline before the
    revision, so a deadline written for a later revision is read with that revision."""

    def __init__(self, context: BaseContext) -> None:
        self._values: Any = context.RawArray("d", [0.0, float("-inf")])

    def publish(self, revision: int, deadline: float) -> None:
        self._values[0] = float(revision)
        self._values[1] = deadline

    def permits(self, revision: int) -> bool:
        deadline: float = self._values[1]
        published: float = self._values[0]
        return published == revision and time.monotonic() < deadline


class ChildProgress:
    """Which record a child started last, and which sequence numbers it must refuse: shared
    by the child and the parent under one lock, so the parent's "do not start it" and the
    child's "starting it" are never both true. The parent reads it to stop a call: a record
    not started yet is refused when its turn comes; a record started is running or done, and
    stopping it means killing the process.

    A stop refuses the record and those sent after it up to then, never what is sent later:
    a refusal that outlived them made the child refuse every record it was sent again, and
    a record sent back to it whenever it was the least loaded never ran (``make chaos``,
    ``SEED=70 DURATION=60``, worker-processes)."""

    def __init__(self, context: BaseContext) -> None:
        self._lock = context.Lock()
        # The last record started, then the first and the last refused.
        self._values: Any = context.RawArray("q", [-1, _NONE_REFUSED, -1])

    def start(self, sequence: int, gate: SharedGate, revision: int) -> bool:
        """In the child, right before user code: whether record ``sequence`` may start."""
        with self._lock:
            refused = self._values[1] <= sequence <= self._values[2]
            if refused or not gate.permits(revision):
                return False
            self._values[0] = sequence
            return True

    def refuse(self, sequence: int, last_sent: int) -> bool:
        """In the parent: make the child refuse record ``sequence`` and the ones sent after
        it so far, up to ``last_sent`` (the runtime sends them again); False when it has
        started that record already and it may still run."""
        with self._lock:
            started: int = self._values[0]
            if started == sequence:
                return False
            if started < sequence:
                self._values[1] = min(self._values[1], sequence)
                self._values[2] = max(self._values[2], last_sent)
            return True

    def started(self) -> int:
        with self._lock:
            last: int = self._values[0]
            return last
