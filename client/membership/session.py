"""The member's session as the member itself must judge it: when it ends, and whether it has
(docs/design.md §5, "The client half"; docs/membership.md, "Zombie members").

The deadline is decided locally, on the monotonic clock: the send time of the last successful
heartbeat plus the session timeout. The coordinator measures from when it *received* that
heartbeat, so the member's deadline is never later than the coordinator's expiry, and a member
frozen or blocked past it (SIGSTOP, a paused VM, a synchronous call in the event loop) learns
it from the clock the moment it runs again, without a round trip.

Kept apart from the heartbeat loop because it is asked from elsewhere, and synchronously: the
hand-out guard asks ``lost`` before every hand-out on the event loop, and pool threads read
``deadline`` as they start a record. Neither may wait for the loop, so both read attributes
and the clock only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# A heartbeat call gets at least this long, even with almost no session left.
_MIN_CALL_S = 0.05


class Session:
    """The session deadline of one member and whether the membership is known lost."""

    def __init__(self, timeout_s: float, on_lost: Callable[[], None]) -> None:
        # The effective session timeout: requested until the coordinator's first reply says it.
        self.timeout_s = timeout_s
        self._on_lost = on_lost
        # When the last successful heartbeat was sent; None while not a member.
        self._renewed_at: float | None = None
        # Set from the moment the membership is known lost (deadline passed, fenced, unknown)
        # until every slice has been dropped: nothing may be handed out in between.
        self.known_lost = False

    def renewed(self, sent_at: float, timeout_s: float) -> None:
        """A heartbeat sent at ``sent_at`` succeeded; the coordinator keeps the member for
        ``timeout_s`` from when it received it."""
        self._renewed_at = sent_at
        self.timeout_s = timeout_s

    def ended(self) -> None:
        """Not a member any more (lost, or left): no deadline until the next join succeeds."""
        self._renewed_at = None

    def lost(self) -> bool:
        """True while the member may not hand out records: from the instant its session
        deadline passed (or the coordinator answered fenced / unknown member) until its slices
        were dropped. Cheap enough to ask before every hand-out; the first caller to see the
        deadline passed tells ``on_lost``, which stops handing out records and wakes the heartbeat
        task to drop the slices and rejoin."""
        if self.known_lost:
            return True
        if self.left_s() > 0:
            return False
        self.mark_lost()
        return True

    def deadline(self) -> float:
        """The monotonic instant from which this member may hand out nothing, for work that
        cannot ask ``lost`` as it goes (a processing pool's thread: asking has effects on the
        event loop). Past already once the membership is known lost."""
        if self.known_lost:
            return float("-inf")
        return time.monotonic() + self.left_s()

    def mark_lost(self) -> None:
        """The membership is lost, whatever the clock says (the coordinator refused it)."""
        if not self.known_lost:
            self.known_lost = True
            self._on_lost()

    def recovered(self) -> None:
        """Every slice of the lost membership has been dropped: hand-outs may resume once
        the member rejoins and is given slices again."""
        self.known_lost = False

    def left_s(self) -> float:
        """Seconds until the session expires; infinite while not a member.

        Measured from when the last good heartbeat was *sent*, which is no later than when
        the coordinator received it: the member gives up no later than the coordinator.
        """
        if self._renewed_at is None:
            return float("inf")
        return self._renewed_at + self.timeout_s - time.monotonic()

    def call_timeout_s(self) -> float:
        """How long a heartbeat call may take: past what is left of the session the slices
        are lost anyway, and the member must notice no later than the coordinator does."""
        return max(min(self.timeout_s, self.left_s()), _MIN_CALL_S)
