"""Group membership through the coordinator's heartbeat endpoint (docs/design.md §5, docs/api.md).

Two long-lived tasks, one per concern. ``Membership`` heartbeats on a ``time.monotonic()``
schedule and publishes each reply's ``assignment`` (what the member may own *now*).
``Reconciler`` moves what the consumer owns towards that target: it first releases
``owned - assignment`` (stop, drain, commit, notify) and wakes the heartbeat so the smaller
``owned`` is reported at once, then acquires ``assignment - owned`` and reports that too.
Keeping them apart lets the member keep heartbeating while a revocation drains in-flight work.

Prompt hand-offs (docs/membership.md): a member with nothing to report offers to wait for its
next reply (``wait_ms``) instead of sleeping its interval, and the coordinator answers when
something changes for it. A wake (a release to report, a refresh) cuts such a wait short:
the waiting call is dropped and a fresh heartbeat sent, which loses nothing, since the
coordinator holds only replies that tell the member nothing new.

Losing the membership (fenced, unknown member, or a passed session deadline) drops every
slice without committing and rejoins with epoch 0, so a zombie never commits over the slices'
new owners. The session deadline is decided locally, on the monotonic clock: the send time of
the last successful heartbeat plus the session timeout. The coordinator measures from when it
*received* that heartbeat, so the member's deadline is never later than the coordinator's
expiry, and a member frozen or blocked past it (SIGSTOP, a paused VM, a synchronous call in
the event loop) learns it from the clock the moment it runs again, without a round trip.
``Membership.session_lost`` is what the consumer asks before every hand-out (docs/design.md §5).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from aiokafka.structs import TopicPartition

from client.errors import (
    CoordinatorUnavailable,
    FencedMemberEpoch,
    KeyrangeClientError,
    UnknownMemberId,
)
from client.http import (
    CoordinatorClient,
    HeartbeatReply,
    HeartbeatRequest,
    IdleNotice,
    Slices,
    StuckCall,
)
from client.protocol.epochs import JOIN_EPOCH, LEAVE_EPOCH
from client.protocol.keyspace import KeyRange, normalize, subtract

logger = logging.getLogger(__name__)

# Reconnect backoff: quick first retries for a coordinator replica restart, capped so a
# member notices a returning coordinator within a couple of seconds.
_BACKOFF_INITIAL_S = 0.1
_BACKOFF_MAX_S = 2.0
# A heartbeat call gets at least this long, even with almost no session left.
_MIN_CALL_S = 0.05


class _Interrupted:
    """A heartbeat that waited for a change was cut short by a wake; none was answered."""


_INTERRUPTED = _Interrupted()


class SliceOwner(Protocol):
    """What the consumer exposes to reconciliation."""

    def owned_slices(self) -> Slices:
        """Every slice still held, including those being released (reported as owned)."""

    def active_slices(self) -> Slices:
        """Slices whose records are being handed out."""

    async def release(self, revoked: Slices) -> None: ...

    async def acquire(self, added: Slices) -> None: ...

    async def lose_all(self) -> None: ...

    def withhold(self) -> None:
        """Hand nothing more out, at once: the membership was just lost. Called before
        ``lose_all``, which drops the slices themselves once it gets its turn."""

    def stuck_report(self) -> list[StuckCall]:
        """Calls that cannot be stopped, holding keys of slices being given up, for the
        coordinator to show (docs/api.md, "Stuck calls")."""


def slices_minus(left: Mapping[TopicPartition, Sequence[KeyRange]], right: Slices) -> Slices:
    result: Slices = {}
    for tp, ranges in left.items():
        rest = subtract(ranges, right.get(tp, ()))
        if rest:
            result[tp] = rest
    return result


class Reconciler:
    """Applies target assignments one at a time, in the order revoke-then-acquire."""

    def __init__(self, owner: SliceOwner, on_owned_changed: Callable[[], None]) -> None:
        self._owner = owner
        self._on_owned_changed = on_owned_changed
        self._target: Slices = {}
        # The last refusal that retrying cannot help, already logged.
        self._refused: str | None = None
        self._changed = asyncio.Event()
        self._settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="keyrange-reconciler")

    def set_target(self, target: Slices) -> None:
        # Applied even when unchanged: the diff is cheap, and it retries an acquire that
        # failed and settles waiters when the grant is empty.
        normalized = {tp: normalize(ranges) for tp, ranges in target.items() if ranges}
        if normalized != self._target:
            self._settled.clear()
        self._target = normalized
        self._changed.set()

    async def wait_settled(self) -> None:
        """Until what the consumer owns matches the latest target."""
        await self._settled.wait()

    async def reset(self) -> None:
        """Abandon whatever is in progress and drop every slice (the membership is lost)."""
        await self.stop()
        self._target = {}
        await self._owner.lose_all()
        self.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        backoff = _BACKOFF_INITIAL_S
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._apply(self._target)
            except KeyrangeClientError as error:
                if error.retriable:
                    logger.warning(
                        "applying the assignment failed; retrying", extra={"error": str(error)}
                    )
                else:
                    # Retrying cannot help (the consumer already raises it to its caller):
                    # say it once, and try again only when the assignment next changes.
                    if str(error) != self._refused:
                        logger.error(
                            "applying the assignment failed: %s",
                            error,
                            extra={"error": error.error},
                        )
                    self._refused = str(error)
                    continue
                self._changed.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            except Exception:
                logger.exception("applying the assignment failed; retrying")
                self._changed.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            self._refused = None
            backoff = _BACKOFF_INITIAL_S
            if not self._changed.is_set():
                self._settled.set()

    async def _apply(self, target: Slices) -> None:
        revoked = slices_minus(self._owner.active_slices(), target)
        if revoked:
            await self._owner.release(revoked)
            self._on_owned_changed()
        added = slices_minus(target, self._owner.active_slices())
        if added:
            await self._owner.acquire(added)
            self._on_owned_changed()


class Membership:
    """A member of one group: join, heartbeat, follow the assignment, leave."""

    def __init__(
        self,
        client: CoordinatorClient,
        group_id: str,
        owner: SliceOwner,
        *,
        topics: Sequence[str],
        assignor: str,
        allow_individual_commit: bool,
        session_timeout_ms: int,
        instance_id: str | None = None,
        client_id: str | None = None,
    ) -> None:
        self._client = client
        self._group_id = group_id
        self._owner = owner
        self._topics = list(topics)
        self._assignor = assignor
        self._allow_individual_commit = allow_individual_commit
        self._instance_id = instance_id
        self._client_id = client_id
        self.member_id: str | None = None
        self.member_epoch = JOIN_EPOCH
        self._session_s = session_timeout_ms / 1000
        self._requested_session_ms = session_timeout_ms
        self._interval_s = self._session_s / 3
        self._last_success: float | None = None
        # Send the next heartbeat without sleeping: the last reply asked for it (it waited out
        # the interval, or brought news), the epoch moved (a new assignment will soon be
        # reported), or it answered a refresh and so did not offer to wait.
        self._beat_again_now = False
        # Why this member gets nothing, as last logged; forgotten once it gets something.
        self._idle_logged: IdleNotice | None = None
        # The stuck calls last reported (which calls, not how long they ran): a heartbeat
        # reports them again only when they change, an empty list clearing them.
        self._stuck_reported: frozenset[tuple[str, int, int, int]] = frozenset()
        # Set from the moment the membership is known lost (deadline passed, fenced, unknown)
        # until every slice has been dropped: nothing may be handed out in between.
        self._lost = False
        self.reconciler = Reconciler(owner, self.wake)
        self._wake: asyncio.Future[None] | None = None
        self._waiters: list[asyncio.Future[bool]] = []
        self._task: asyncio.Task[None] | None = None
        self.failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self) -> None:
        self.reconciler.start()
        self._task = asyncio.create_task(self._run(), name="keyrange-heartbeat")

    def identity(self) -> tuple[str | None, int | None]:
        if self.member_id is None:
            return None, None
        return self.member_id, self.member_epoch

    def session_lost(self) -> bool:
        """True while the member may not hand out records: from the instant its session
        deadline passed (or the coordinator answered fenced / unknown member) until its slices
        were dropped. Cheap enough to ask before every hand-out; the first caller to see the
        deadline passed wakes the heartbeat task, which drops the slices and rejoins."""
        if self._lost:
            return True
        if self._session_left() > 0:
            return False
        self._mark_lost()
        return True

    def session_deadline(self) -> float:
        """The monotonic instant from which this member may hand out nothing, for work that
        cannot ask ``session_lost`` as it goes (a processing pool's thread: asking has
        effects on the event loop). Past already once the membership is known lost."""
        if self._lost:
            return float("-inf")
        return time.monotonic() + self._session_left()

    def _mark_lost(self) -> None:
        if not self._lost:
            self._lost = True
            self._owner.withhold()
            self.wake()

    def wake(self) -> None:
        """Heartbeat now rather than at the next interval (what the member owns changed, or
        a refresh was asked for), cutting short a heartbeat that waits for a change."""
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def refresh(self) -> bool:
        """Heartbeat once now; True when the member is still in the group afterwards."""
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.wake()
        return await waiter

    async def leave(self) -> None:
        """Stop heartbeating and tell the coordinator, so the slices move without waiting
        for the session to expire."""
        await self.reconciler.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._resolve_waiters(False)
        if self.member_id is None:
            return
        request = HeartbeatRequest(
            member_epoch=LEAVE_EPOCH,
            member_id=self.member_id,
            instance_id=self._instance_id,
            client_id=self._client_id,
        )
        try:
            await asyncio.wait_for(self._client.heartbeat(self._group_id, request), self._session_s)
        except (KeyrangeClientError, TimeoutError) as error:
            logger.warning(
                "leaving the group failed; the session will expire instead",
                extra={"group_id": self._group_id, "error": str(error)},
            )
        self.member_id, self.member_epoch = None, JOIN_EPOCH

    async def _run(self) -> None:
        backoff = _BACKOFF_INITIAL_S
        while True:
            # Created before the heartbeat so a wake() during it is not lost.
            self._wake = asyncio.get_running_loop().create_future()
            if self.session_lost():
                # Checked before sending: a heartbeat sent past the deadline could still be
                # answered with the old assignment by a coordinator that has not reaped yet.
                logger.warning(
                    "session deadline passed without a successful heartbeat; slices are lost",
                    extra={"group_id": self._group_id, "member_id": self.member_id},
                )
                self._resolve_waiters(False)
                await self._lose()
                continue
            sent_at = time.monotonic()
            error = await self._beat()
            if isinstance(error, _Interrupted) or (error is None and self.session_lost()):
                continue
            if error is None:
                backoff = _BACKOFF_INITIAL_S
                self._resolve_waiters(True)
                delay = (
                    0.0 if self._beat_again_now else self._interval_s - (time.monotonic() - sent_at)
                )
            elif isinstance(error, FencedMemberEpoch | UnknownMemberId):
                logger.warning(
                    "membership lost; rejoining",
                    extra={"group_id": self._group_id, "error": error.error},
                )
                self._resolve_waiters(False)
                await self._lose()
                delay = 0.0
            elif error.retriable:
                self._resolve_waiters(False)
                # Wake up in time to give the slices up when the session runs out.
                delay = min(backoff, self._session_left())
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
            else:
                self._resolve_waiters(False)
                self.failure.set_exception(error)
                return
            await self._sleep(delay)

    def _wait_s(self) -> float:
        """How long the next heartbeat may wait for a change: not while joining or while a
        refresh waits for an answer, never past the interval, and with room to spare before
        the session deadline and the HTTP timeout."""
        if self.member_epoch == JOIN_EPOCH or self._waiters:
            return 0.0
        return max(
            0.0,
            min(
                self._interval_s,
                self._session_s / 3,
                self._session_left() / 2,
                self._client.request_timeout_s / 2,
            ),
        )

    async def _beat(self) -> KeyrangeClientError | _Interrupted | None:
        joining = self.member_epoch == JOIN_EPOCH
        # A refresh wants its answer now, so this heartbeat does not offer to wait; the next
        # one, sent at once, does.
        answering_refresh = bool(self._waiters)
        wait_s = self._wait_s()
        request = HeartbeatRequest(
            member_epoch=self.member_epoch,
            member_id=self.member_id,
            instance_id=self._instance_id,
            client_id=self._client_id,
            subscribed_topics=self._topics if joining else None,
            assignor=self._assignor if joining else None,
            allow_individual_commit=self._allow_individual_commit,
            session_timeout_ms=self._requested_session_ms,
            owned=self._owner.owned_slices(),
            wait_ms=int(wait_s * 1000) or None,
            stuck=self._stuck(),
        )
        sent_at = time.monotonic()
        # Bounded by what is left of the session: past it the slices are lost anyway, and the
        # member must notice no later than the coordinator does.
        call = asyncio.ensure_future(
            asyncio.wait_for(
                self._client.heartbeat(self._group_id, request),
                max(min(self._session_s, self._session_left()), _MIN_CALL_S),
            )
        )
        if request.wait_ms and self._wake is not None:
            interrupted = False
            try:
                await asyncio.wait((call, self._wake), return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Cut short by a wake, or the heartbeat task is being stopped (a leave): the
                # waiting call is dropped, never left running on a client about to close.
                if not call.done():
                    call.cancel()
                    interrupted = True
            if interrupted:
                return _INTERRUPTED
        try:
            reply = await call
        except TimeoutError:
            return CoordinatorUnavailable("heartbeat timed out")
        except KeyrangeClientError as error:
            return error
        if self._lost:
            # The deadline passed while this heartbeat was on the wire and records were
            # already withdrawn: the loss stands, whatever the coordinator answered.
            return None
        self._last_success = sent_at
        if reply.member_id != self.member_id or reply.member_epoch != self.member_epoch:
            logger.info(
                "member epoch changed",
                extra={
                    "group_id": self._group_id,
                    "member_id": reply.member_id,
                    "member_epoch": reply.member_epoch,
                },
            )
        self._beat_again_now = (
            reply.heartbeat_now
            or answering_refresh
            or reply.member_id != self.member_id
            or reply.member_epoch != self.member_epoch
        )
        self.member_id = reply.member_id
        self.member_epoch = reply.member_epoch
        self._interval_s = reply.heartbeat_interval_ms / 1000
        self._session_s = reply.session_timeout_ms / 1000
        self._log_idle(reply)
        self.reconciler.set_target(reply.assignment)
        return None

    def _stuck(self) -> list[StuckCall] | None:
        """The stuck calls when they changed since the last report (an empty list once they
        have all ended), else nothing: the coordinator ages a report itself, and an older
        coordinator never sees the field from a member with nothing stuck."""
        stuck = self._owner.stuck_report()
        calls = frozenset((c.topic, c.partition, c.key_hash, c.offset) for c in stuck)
        if calls == self._stuck_reported:
            return None
        self._stuck_reported = calls
        return stuck

    def _log_idle(self, reply: HeartbeatReply) -> None:
        """Once per reason: a member left idle by a switch is otherwise silent, and looks
        like a member that is simply waiting for records."""
        if reply.assignment:
            self._idle_logged = None
            return
        if reply.idle is None or reply.idle == self._idle_logged:
            return
        self._idle_logged = reply.idle
        hint = ""
        if reply.idle.switch == "accept.range.fetch":
            hint = (
                "; or from Python, with an admin token: "
                "await CoordinatorClient(url, token=...).set_accept_range_fetch(topic)"
            )
        logger.warning(
            "this member gets no records: %s%s",
            reply.idle.message,
            hint,
            extra={
                "group_id": self._group_id,
                "member_id": reply.member_id,
                "switch": reply.idle.switch,
                "topics": list(reply.idle.topics),
            },
        )

    def _session_left(self) -> float:
        """Seconds until the session expires; infinite while not a member.

        Measured from when the last good heartbeat was *sent*, which is no later than when
        the coordinator received it: the member gives up no later than the coordinator.
        """
        if self._last_success is None or self.member_id is None:
            return float("inf")
        return self._last_success + self._session_s - time.monotonic()

    async def _lose(self) -> None:
        self._mark_lost()
        self.member_id, self.member_epoch = None, JOIN_EPOCH
        self._last_success = None
        try:
            await self.reconciler.reset()
        finally:
            self._lost = False

    async def _sleep(self, delay: float) -> None:
        if self._wake is None or self._waiters:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._wake), max(delay, 0.0))

    def _resolve_waiters(self, outcome: bool) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(outcome)
