"""The stable member's heartbeat answered by the HTTP protocol itself, with no ASGI task
(``coordinator/direct_routes.py`` says when, and how a request is handed to the ASGI path).

With prompt hand-offs every stable member keeps a heartbeat open: 10,000 members on one replica
are 3,300 held replies a second, and through uvicorn's ASGI cycle each cost its task, its scope
and message dicts and the middlewares' calls besides its own work. Once the body is complete
the cycle runs the heartbeat route's checks in its order, queues the session's renewal with the
batched renewals, and on the renewal's callback either writes the reply or, for a member that
may wait, starts the held wait on a timer and writes the reply when it ends. Only the stable
case is answered here: a join, a leave, a heartbeat carrying a subscription, a report, or one
of a member that the watch remembers as unsettled or whose renewal finds it not stable is
handed to the ASGI path, which takes it from its start. docs/membership.md, "The heartbeat's
HTTP path"; which requests it serves is decided in ``coordinator/groups/serve.py``.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from starlette.types import Scope

from coordinator.direct_routes import DirectCycle
from coordinator.groups import fast_path, heartbeat, serve
from coordinator.groups.repository import StableHeartbeat
from coordinator.groups.schemas import HeartbeatRequest
from coordinator.groups.watch import HeldHeartbeat, MembershipWatch
from coordinator.metrics import HEARTBEATS_WAITING
from coordinator.settings import Settings


class DirectHeartbeat(DirectCycle["tuple[str, HeartbeatRequest]"]):
    """One heartbeat's cycle."""

    route = fast_path.ROUTE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Where a held reply's wait is counted from, as the ASGI path counts it.
        self._arrived = asyncio.get_running_loop().time()
        # While a reply waits: its group, its held heartbeat and the reply, kept here rather
        # than in a callback's arguments (fewer objects per waiting member, below).
        self._held_group = ""
        self._held: HeldHeartbeat | None = None
        self._held_reply = b""

    def _checked(self, scope: Scope, settings: Settings) -> tuple[str, HeartbeatRequest]:
        """The group id and the request."""
        if not fast_path.is_json(_content_type(scope)):
            raise ValueError("not a JSON body")
        return fast_path.checked_request(self._raw_group_id, bytes(self.body))

    def _serve(self, checked: tuple[str, HeartbeatRequest]) -> None:
        group_id, request = checked
        state = self._coordinator.state
        renewal = serve.protocol_renewal(group_id, request, state.settings)
        if renewal is None:
            self._hand_over()
            return
        watch: MembershipWatch = state.membership_watch
        if serve.skips_renewal(watch, group_id, request):
            # Sure to fail its renewal: the locked path serves it at once.
            self._scope[fast_path.NOT_STABLE_SINCE] = (self._arrived, self._started)
            self._hand_over()
            return
        held = watch.hold(group_id, renewal.member_id) if serve.may_wait(watch, request) else None
        renewed = heartbeat.renewals_of(state.engine).enqueue(renewal)
        renewed.add_done_callback(partial(self._renewed, group_id, request, held))

    def _renewed(
        self,
        group_id: str,
        request: HeartbeatRequest,
        held: HeldHeartbeat | None,
        renewed: asyncio.Future[StableHeartbeat | None],
    ) -> None:
        state = self._coordinator.state
        failed = renewed.cancelled() or renewed.exception() is not None
        if failed or renewed.result() is None:
            if held is not None:
                state.membership_watch.release(group_id, held)
            if failed:
                # The ASGI path answers what the renewal raised.
                self._hand_over(_Raising(renewed, self._started))
                return
            # The ASGI path serves a member that is not stable (any longer) from the
            # request's start, on its locked path at once, registering its own held reply.
            self._scope[fast_path.NOT_STABLE_SINCE] = (self._arrived, self._started)
            self._hand_over()
            return
        stable = renewed.result()
        assert stable is not None
        settings = state.settings
        if held is None:
            self._answer(heartbeat.stable_reply(request, stable, settings, heartbeat_now=False))
            return
        interval_ms = heartbeat.heartbeat_interval(stable.session_timeout_ms, settings)
        HEARTBEATS_WAITING.inc()
        woken = held.begin_wait(
            serve.STABLE_HOLD, serve.wait_deadline(request, interval_ms, self._arrived)
        )
        # A reply that waited took the place of the member's sleep: it heartbeats again at
        # once, whether the wait ended on a change or ran out. The reply is built now, so
        # that only its bytes wait with the member: every container a waiting member keeps
        # is walked by each young collection of the garbage collector, which stops the event
        # loop, and ten thousand members wait at once (docs/operations.md, "Waiting members").
        self._held_group, self._held = group_id, held
        self._held_reply = heartbeat.stable_reply(request, stable, settings, heartbeat_now=True)
        woken.add_done_callback(self._waited)

    def _waited(self, woken: asyncio.Future[bool]) -> None:
        held = self._held
        assert held is not None
        self._held = None
        HEARTBEATS_WAITING.dec()
        self._coordinator.state.membership_watch.release(self._held_group, held)
        serve.count_wait(woken.result())
        self._answer(self._held_reply)

    def _answer(self, reply: bytes) -> None:
        self._reply_json(reply)
        fast_path.record_served(self._started)


class _Raising:
    """An ASGI application answering a renewal's failure as the ASGI path does."""

    def __init__(self, renewed: asyncio.Future[StableHeartbeat | None], started: float) -> None:
        self._renewed = renewed
        self._started = started

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await fast_path.serve_answer(scope, receive, send, self._failure(), self._started)

    async def _failure(self) -> bytes:
        self._renewed.result()  # raises what the renewal raised
        raise AssertionError("a renewal handed over without failing")


def _content_type(scope: Any) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bytes(value)
    return b""
