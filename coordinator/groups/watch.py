"""Held heartbeats, and the group changes that answer them on every replica
(``coordinator.core.handoff`` decides which reply may wait and whom a change concerns).

Every transaction that changes a group announces the change with ``pg_notify``
(``repository.announce_change``). Postgres delivers a notice when its transaction commits, to
every session listening on the channel: each coordinator replica, this one included, keeps one
connection listening, so a heartbeat held on one replica hears of a join served by another,
and never of a change that rolled back. While that connection is down no heartbeat is held
(the member is answered at once and sleeps its interval, as without prompt hand-offs): hand-offs
slow down, nothing else changes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from typing import Any

import asyncpg
from sqlalchemy.engine import URL

from coordinator.core.handoff import GroupChange, Hold

log = logging.getLogger(__name__)

CHANNEL = "keyrange_membership"
# Postgres refuses a notice payload of 8,000 bytes or more; a change naming more members than
# fit is announced as concerning all of them (an extra heartbeat each, nothing worse).
_MAX_PAYLOAD_BYTES = 7_900


def encode_change(change: GroupChange) -> str:
    document = {
        "g": change.group_id,
        "m": None if change.retargeted is None else sorted(change.retargeted),
        "r": change.released,
        "by": change.by,
    }
    payload = json.dumps(document, separators=(",", ":"))
    if len(payload.encode()) > _MAX_PAYLOAD_BYTES:
        payload = json.dumps({**document, "m": None}, separators=(",", ":"))
    return payload


def decode_change(payload: str) -> GroupChange | None:
    """The change a notice announces; None for a notice this version does not understand (a
    newer replica's, during a rolling upgrade), which wakes nobody."""
    try:
        document = json.loads(payload)
        members = document["m"]
        return GroupChange(
            group_id=str(document["g"]),
            retargeted=None if members is None else frozenset(str(m) for m in members),
            released=bool(document["r"]),
            by=None if document.get("by") is None else str(document["by"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


class HeldHeartbeat:
    """One heartbeat that may wait. Registered before the heartbeat is served, so a change
    committed by another request while this one is being served is not missed.

    A waiting member costs this object, one future and one timer: ten thousand of them wait
    at once on a busy replica, so the wait is not built from ``asyncio.wait_for`` and
    ``asyncio.shield``, which add a task and two futures each."""

    __slots__ = ("_early", "_hold", "_timer", "_woken", "member_id")

    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        # Changes offered before the wait began; a tuple, as most heartbeats get none and a
        # list would be one more container for the garbage collector per waiting member.
        self._early: tuple[GroupChange, ...] = ()
        self._hold: Hold | None = None
        self._timer: asyncio.TimerHandle | None = None
        # True when a change concerning the member ended the wait, False when it ran out.
        self._woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def offer(self, change: GroupChange) -> None:
        if self._hold is None:
            self._early += (change,)
        elif not self._woken.done() and change.concerns(self.member_id, self._hold):
            self._woken.set_result(True)
            self._stop_timer()

    def _time_up(self) -> None:
        self._timer = None
        if not self._woken.done():
            self._woken.set_result(False)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def begin_wait(self, hold: Hold, deadline: float) -> asyncio.Future[bool]:
        """The wait's outcome: True once a change concerns the member (at once when one
        already did), False once the loop's clock reaches ``deadline`` (at once when it
        already has). For a caller that cannot await; others call :meth:`wait`."""
        self._hold = hold
        if any(change.concerns(self.member_id, hold) for change in self._early):
            self._woken.set_result(True)
        else:
            self._early = ()
            self._timer = asyncio.get_running_loop().call_at(deadline, self._time_up)
        return self._woken

    async def wait(self, hold: Hold, deadline: float) -> bool:
        """Until a change concerns the member (True) or the loop's clock reaches ``deadline``
        (False; at once when it already has)."""
        woken = self.begin_wait(hold, deadline)
        try:
            return await woken
        finally:
            self._stop_timer()


# Members remembered as unsettled at most; past it the oldest are forgotten, which only costs
# each of them one renewal that finds it not stable.
UNSETTLED_LIMIT = 65_536


class MembershipWatch:
    """The held heartbeats of this process, by group, and the connection that hears changes.

    It also remembers which members' next heartbeat is sure to need the locked path: the
    stable renewal's guard requires a member's owned, assigned and target slices to be equal,
    so a member whose stored row differs (the locked path just stored a release or a grant
    still to finish) or whose target a change just moved fails its renewal. During a join's
    hand-off each heartbeat of the chain is one of these, and a renewal that is bound to fail
    costs it a turn in the renewals' batch before the locked path starts (docs/membership.md,
    "Unsettled members"). Forgetting one only costs that turn; remembering one wrongly costs a
    locked heartbeat where a renewal would have done, never a different reply."""

    def __init__(self) -> None:
        self._held: defaultdict[str, set[HeldHeartbeat]] = defaultdict(set)
        self._listening = False
        self._unsettled: dict[tuple[str, str], None] = {}

    @property
    def listening(self) -> bool:
        return self._listening

    def hold(self, group_id: str, member_id: str) -> HeldHeartbeat:
        """A heartbeat of ``member_id`` that may wait, hearing the group's changes until
        :meth:`release`."""
        held = HeldHeartbeat(member_id)
        self._held[group_id].add(held)
        return held

    def release(self, group_id: str, held: HeldHeartbeat) -> None:
        waiting = self._held[group_id]
        waiting.discard(held)
        if not waiting:
            del self._held[group_id]

    def deliver(self, change: GroupChange) -> None:
        retargeted = change.retargeted or ()
        for held in tuple(self._held.get(change.group_id, ())):
            held.offer(change)
            if held.member_id in retargeted and held.member_id != change.by:
                self.remember_unsettled(change.group_id, held.member_id)

    def remember_unsettled(self, group_id: str, member_id: str) -> None:
        """The member's next heartbeat here goes to the locked path without a renewal."""
        key = (group_id, member_id)
        self._unsettled.pop(key, None)
        self._unsettled[key] = None
        if len(self._unsettled) > UNSETTLED_LIMIT:
            del self._unsettled[next(iter(self._unsettled))]

    def forget_unsettled(self, group_id: str, member_id: str) -> None:
        self._unsettled.pop((group_id, member_id), None)

    def take_unsettled(self, group_id: str, member_id: str) -> bool:
        """Whether the member was remembered as unsettled; forgotten either way, so that it
        skips one renewal at most for what was remembered."""
        key = (group_id, member_id)
        if key not in self._unsettled:
            return False
        del self._unsettled[key]
        return True

    async def listen(self, database_url: URL) -> None:
        """Hear changes until the connection is lost (then raise, so the caller's loop
        reconnects) or the task is cancelled."""
        connection = await asyncpg.connect(
            database_url.set(drivername="postgresql").render_as_string(hide_password=False),
            server_settings={"application_name": "keyrange-membership-watch"},
        )
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_notice(_: object, __: int, ___: str, payload: object) -> None:
            change = decode_change(str(payload))
            if change is not None:
                self.deliver(change)

        def on_lost(_: object) -> None:
            if not lost.done():
                lost.set_result(None)

        connection.add_termination_listener(on_lost)
        try:
            await _subscribe(connection, on_notice)
            self._listening = True
            log.info("listening for membership changes", extra={"channel": CHANNEL})
            await lost
            raise ConnectionError("the membership watch lost its database connection")
        finally:
            self._listening = False
            if lost.done():
                # A lost connection cannot say goodbye: closing it politely raises an
                # internal driver error that would hide the ConnectionError above.
                connection.terminate()
            elif not connection.is_closed():
                await connection.close(timeout=5)


async def _subscribe(connection: asyncpg.Connection, on_notice: Any) -> None:
    """LISTEN on ``connection``. A database shutting down can close a connection right after
    it opened (its closing message arrives while LISTEN is being sent), which asyncpg reports
    as an ``InternalClientError`` about its own state rather than as a lost connection; a
    connection closed by then is the outage it looks like to an operator. Any other
    ``InternalClientError`` stays what it is."""
    try:
        await connection.add_listener(CHANNEL, on_notice)
    except asyncpg.InternalClientError as error:
        if connection.is_closed():
            raise ConnectionError(
                "the membership watch lost its database connection as it opened"
            ) from error
        raise
