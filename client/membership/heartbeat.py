"""The heartbeat loop and its pacing: when a member heartbeats, and what it does with each
outcome (docs/design.md §5, docs/membership.md).

A member heartbeats on a ``time.monotonic()`` schedule and hands each reply's ``assignment``
(what it may own *now*) to the reconciler. What goes into a request is the exchange's
(``client.membership.exchange``), whether the session still holds is the session's
(``client.membership.session``); this loop only paces them.

Prompt hand-offs (docs/membership.md): a member with nothing to report offers to wait for its
next reply (``wait_ms``) instead of sleeping its interval, and the coordinator answers when
something changes for it. A wake (a release to report, a refresh) cuts such a wait short:
the waiting call is dropped and a fresh heartbeat sent, which loses nothing, since the
coordinator holds only replies that tell the member nothing new.

Losing the membership (fenced, unknown member, or a passed session deadline) drops every
slice without committing and rejoins with epoch 0, so a zombie never commits over the slices'
new owners.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from client.errors import (
    CoordinatorUnavailable,
    FencedMemberEpoch,
    KeyrangeClientError,
    UnknownMemberId,
)
from client.http import CoordinatorClient, Slices
from client.membership.exchange import Exchange
from client.membership.reconcile import BACKOFF_INITIAL_S, BACKOFF_MAX_S, Reconciler, SliceOwner
from client.membership.reports import Reports
from client.membership.session import Session

logger = logging.getLogger(__name__)


class _Interrupted:
    """A heartbeat that waited for a change was cut short by a wake; none was answered."""


_INTERRUPTED = _Interrupted()


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
        endpoint: str | None = None,
    ) -> None:
        self._owner = owner
        self._exchange = Exchange(
            client,
            group_id,
            topics=topics,
            assignor=assignor,
            allow_individual_commit=allow_individual_commit,
            session_timeout_ms=session_timeout_ms,
            instance_id=instance_id,
            client_id=client_id,
            endpoint=endpoint,
        )
        self._session = Session(session_timeout_ms / 1000, self._session_lost)
        self._reports = Reports(group_id, owner.stuck_report)
        self._interval_s = self._session.timeout_s / 3
        # Send the next heartbeat without sleeping: the last reply asked for it (it waited out
        # the interval, or brought news), the epoch moved (a new assignment will soon be
        # reported), or it answered a refresh and so did not offer to wait.
        self._beat_again_now = False
        self.reconciler = Reconciler(owner, self.wake)
        self._wake: asyncio.Future[None] | None = None
        self._waiters: list[asyncio.Future[bool]] = []
        self._task: asyncio.Task[None] | None = None
        self.failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def member_id(self) -> str | None:
        return self._exchange.member_id

    @property
    def member_epoch(self) -> int:
        return self._exchange.member_epoch

    def start(self) -> None:
        self.reconciler.start()
        self._task = asyncio.create_task(self._run(), name="keyrange-heartbeat")

    def identity(self) -> tuple[str | None, int | None]:
        return self._exchange.identity()

    def session_lost(self) -> bool:
        """Whether the member may hand out nothing now (``Session.lost``): asked before
        every hand-out, and the first to see the deadline passed starts the loss."""
        return self._session.lost()

    def session_deadline(self) -> float:
        """The same as an instant, for a pool thread (``Session.deadline``)."""
        return self._session.deadline()

    def _session_lost(self) -> None:
        """The session was just found lost, perhaps by a hand-out guard: nothing more goes
        out from this instant, and the loop wakes to drop the slices and rejoin."""
        self._owner.lose()
        self.wake()

    def report_standbys(self, standbys: Slices) -> None:
        """The key ranges this member keeps warm standbys of now; a change is heartbeated at
        once, so the coordinator's next rebalance knows where they are."""
        if self._reports.set_standbys(standbys):
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
        await self._exchange.leave(self._session.timeout_s)
        self._session.ended()

    async def _run(self) -> None:
        backoff = BACKOFF_INITIAL_S
        group_id = self._exchange.group_id
        while True:
            # Created before the heartbeat so a wake() during it is not lost.
            self._wake = asyncio.get_running_loop().create_future()
            if self.session_lost():
                # Checked before sending: a heartbeat sent past the deadline could still be
                # answered with the old assignment by a coordinator that has not reaped yet.
                logger.warning(
                    "session deadline passed without a successful heartbeat; slices are lost",
                    extra={"group_id": group_id, "member_id": self.member_id},
                )
                self._resolve_waiters(False)
                await self._lose()
                continue
            sent_at = time.monotonic()
            error = await self._beat()
            if isinstance(error, _Interrupted) or (error is None and self.session_lost()):
                continue
            if error is None:
                backoff = BACKOFF_INITIAL_S
                self._resolve_waiters(True)
                delay = (
                    0.0 if self._beat_again_now else self._interval_s - (time.monotonic() - sent_at)
                )
            elif isinstance(error, FencedMemberEpoch | UnknownMemberId):
                logger.warning(
                    "membership lost; rejoining",
                    extra={"group_id": group_id, "error": error.error},
                )
                self._resolve_waiters(False)
                await self._lose()
                delay = 0.0
            elif error.retriable:
                self._resolve_waiters(False)
                # Wake up in time to give the slices up when the session runs out.
                delay = min(backoff, self._session.left_s())
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            else:
                self._resolve_waiters(False)
                self.failure.set_exception(error)
                return
            await self._sleep(delay)

    def _wait_s(self) -> float:
        """How long the next heartbeat may wait for a change: not while joining or while a
        refresh waits for an answer, never past the interval, and with room to spare before
        the session deadline and the HTTP timeout."""
        if self._exchange.joining or self._waiters:
            return 0.0
        return max(
            0.0,
            min(
                self._interval_s,
                self._session.timeout_s / 3,
                self._session.left_s() / 2,
                self._exchange.request_timeout_s / 2,
            ),
        )

    async def _beat(self) -> KeyrangeClientError | _Interrupted | None:
        # A refresh wants its answer now, so this heartbeat does not offer to wait; the next
        # one, sent at once, does.
        answering_refresh = bool(self._waiters)
        standbys = self._reports.standbys()
        request = self._exchange.request(
            self._owner.owned_slices(), self._wait_s(), self._reports.stuck(), standbys
        )
        sent_at = time.monotonic()
        call = asyncio.ensure_future(self._exchange.send(request, self._session.call_timeout_s()))
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
        if self._session.known_lost:
            # The deadline passed while this heartbeat was on the wire and records were
            # already withdrawn: the loss stands, whatever the coordinator answered.
            return None
        self._session.renewed(sent_at, reply.session_timeout_ms / 1000)
        moved = self._exchange.accept(reply)
        self._reports.standbys_stored(standbys)
        self._beat_again_now = reply.heartbeat_now or answering_refresh or moved
        self._interval_s = reply.heartbeat_interval_ms / 1000
        self._reports.log_idle(reply)
        self.reconciler.set_target(reply.assignment)
        return None

    async def _lose(self) -> None:
        self._session.mark_lost()
        self._exchange.forget()
        self._reports.standbys_forgotten()
        self._session.ended()
        try:
            await self.reconciler.reset()
        finally:
            self._session.recovered()

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
