"""What a member tells beyond what it owns: the calls it cannot stop and the key ranges it
keeps standbys of, to the coordinator, and why it gets nothing, to its log (docs/api.md
"Stuck calls" and "Standby key ranges", docs/membership.md "Idle members are told why").

Each is said once per change: the coordinator ages a stuck-call report itself and keeps a
member's standbys until told otherwise, and an idle member's reason repeats on every reply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from client.http import HeartbeatReply, IdleNotice, Slices, StuckCall
from client.protocol.keyspace import normalize

logger = logging.getLogger(__name__)


class Reports:
    """The stuck calls last reported and the idle reason last logged, for one member."""

    def __init__(
        self,
        group_id: str,
        stuck_calls: Callable[[], list[StuckCall]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._group_id = group_id
        self._stuck_calls = stuck_calls
        self._clock = clock
        # Since when replies have given this member nothing for the same reason.
        self._idle_since: tuple[IdleNotice, float] | None = None
        # The stuck calls last reported (which calls, not how long they ran): a heartbeat
        # reports them again only when they change, an empty list clearing them.
        self._stuck_reported: frozenset[tuple[str, int, int, int]] = frozenset()
        # Why this member gets nothing, as last logged; forgotten once it gets something.
        self._idle_logged: IdleNotice | None = None
        # The standbys kept now, and those the coordinator is known to have stored (None:
        # unknown, a heartbeat carrying them got no answer): sent until a reply confirms
        # them, so a lost heartbeat or a new membership (whose member row starts with none)
        # gets them again.
        self._standbys: Slices = {}
        self._standbys_stored: Slices | None = {}

    def stuck(self) -> list[StuckCall] | None:
        """The stuck calls when they changed since the last report (an empty list once they
        have all ended), else nothing: the coordinator ages a report itself, and an older
        coordinator never sees the field from a member with nothing stuck."""
        stuck = self._stuck_calls()
        calls = frozenset((c.topic, c.partition, c.key_hash, c.offset) for c in stuck)
        if calls == self._stuck_reported:
            return None
        self._stuck_reported = calls
        return stuck

    def set_standbys(self, standbys: Slices) -> bool:
        """Keep ``standbys`` as the ones to report; True when they changed (heartbeats carry
        them until one is answered either way)."""
        kept = {tp: normalize(ranges) for tp, ranges in standbys.items() if ranges}
        changed = kept != self._standbys
        self._standbys = kept
        return changed

    def standbys(self) -> Slices | None:
        """The standbys for a heartbeat about to be sent, when the coordinator may not have
        them, else nothing, so an older coordinator never sees the field from a member that
        keeps none."""
        if self._standbys == self._standbys_stored:
            return None
        # Until its answer, the coordinator may have stored them or not.
        self._standbys_stored = None
        return dict(self._standbys)

    def standbys_stored(self, sent: Slices | None) -> None:
        """A heartbeat carrying ``sent`` was answered: the coordinator has them."""
        if sent is not None:
            self._standbys_stored = sent

    def standbys_forgotten(self) -> None:
        """The membership is over; the next one's member row starts with no standbys."""
        self._standbys_stored = {}

    def log_idle(self, reply: HeartbeatReply) -> None:
        """Once per reason, once it has lasted a session: a member left idle by a switch is
        otherwise silent, and looks like a member that is simply waiting for records.

        Right after a rejoin (a coordinator freeze, a lost session) the partitions can still
        be held by this process's own earlier membership until its session expires; the
        reply then names the switch although waiting is all it takes. An idle reason that
        outlasts the session timeout is no such race."""
        if reply.assignment:
            self._idle_logged = None
            self._idle_since = None
            return
        now = self._clock()
        if reply.idle is not None and (
            self._idle_since is None or self._idle_since[0] != reply.idle
        ):
            self._idle_since = (reply.idle, now)
        if self._idle_since is None:
            return
        idle, since = self._idle_since
        if idle == self._idle_logged or now - since < reply.session_timeout_ms / 1000:
            return
        self._idle_logged = idle
        hint = ""
        if idle.switch == "accept.range.fetch":
            hint = (
                "; or from Python, with an admin token: "
                "await CoordinatorClient(url, token=...).set_accept_range_fetch(topic)"
            )
        logger.warning(
            "this member gets no records: %s%s",
            idle.message,
            hint,
            extra={
                "group_id": self._group_id,
                "member_id": reply.member_id,
                "switch": idle.switch,
                "topics": list(idle.topics),
            },
        )
