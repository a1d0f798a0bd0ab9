"""Which path serves a heartbeat, decided in one place for its three doors.

A heartbeat comes in through one of three doors: the HTTP protocol itself
(``coordinator/groups/direct.py``), the bare ASGI handler ahead of FastAPI
(``coordinator/groups/fast_path.py``) and the declared FastAPI route
(``coordinator/groups/endpoints.py``). Each door only reads and checks the request and sends
the reply; which path serves it, and whether its reply waits for a change, is decided here.

The paths, cheapest first (``coordinator/groups/heartbeat.py`` implements them):

1. the **renewal**: a stable member's session renewed by one batched statement, whose guard
   matches only when the step would change nothing;
2. the **own-row** path: the step decided on a snapshot and stored on the member's own row
   only, without the group's turn or lock;
3. the **locked** path: the step under the group's turn and row lock.

:func:`first_path` says which of them may serve a request; each path that declines a request
hands it to the next. docs/membership.md, "The heartbeat's HTTP path", "Unsettled members" and
"Heartbeats without the group's turn".
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import Scope

from client.protocol.epochs import JOIN_EPOCH
from coordinator import metrics
from coordinator.auth import admitted
from coordinator.core.handoff import Hold
from coordinator.groups import heartbeat
from coordinator.groups.repository import Renewal, StableHeartbeat
from coordinator.groups.schemas import HeartbeatReply, HeartbeatRequest, check_endpoint
from coordinator.groups.turns import GroupTurns
from coordinator.groups.watch import HeldHeartbeat, MembershipWatch
from coordinator.settings import Settings

# A stable member's reply: it has nothing to do, so it may always wait for a change.
STABLE_HOLD = Hold(short_of_target=False)


class HeartbeatPath(enum.IntEnum):
    """The paths a heartbeat may take, in the order they are tried."""

    RENEWAL = 1
    OWN_ROW = 2
    LOCKED = 3


def first_path(request: HeartbeatRequest) -> HeartbeatPath:
    """The cheapest path that may serve ``request``.

    Only a member's heartbeat (not a join or a leave) may skip the locked path. A report of
    stuck calls and an advertised endpoint are stored by the locked path alone: reports are
    rare (a member sends one when its list changes) and an endpoint is sent on joining, so
    the common heartbeat's statements stay as they are. A report of standbys, which a streams
    instance sends when its standbys change, is not one the renewal's statement stores."""
    if request.member_epoch <= JOIN_EPOCH or request.member_id is None:
        return HeartbeatPath.LOCKED
    if request.stuck is not None or request.endpoint is not None:
        return HeartbeatPath.LOCKED
    if request.standbys is not None:
        return HeartbeatPath.OWN_ROW
    return HeartbeatPath.RENEWAL


def renewal(group_id: str, request: HeartbeatRequest, settings: Settings) -> Renewal | None:
    """The renewal ``request`` asks for when it may be stable; None when it needs a step."""
    if first_path(request) is not HeartbeatPath.RENEWAL:
        return None
    return heartbeat.stable_renewal(group_id, request, settings)


def protocol_renewal(
    group_id: str, request: HeartbeatRequest, settings: Settings
) -> Renewal | None:
    """The renewal the protocol's door may queue for ``request``; None hands the request to
    the ASGI doors, which serve it from its start. That door serves only a stable member,
    and cannot learn a newly subscribed topic's partitions from Kafka first, so a heartbeat
    carrying a subscription goes on too."""
    if request.subscribed_topics is not None or request.subscribed_topic_regex is not None:
        return None
    return renewal(group_id, request, settings)


async def stable_heartbeat(
    engine: AsyncEngine, group_id: str, request: HeartbeatRequest, settings: Settings
) -> StableHeartbeat | None:
    """Renew a stable member's session, or None when the request needs a step. The common
    case by far, so it takes no transaction and no lock of its own: concurrent renewals share
    one statement (``coordinator/groups/renewals.py``), and ``heartbeat.stable_reply``
    answers without decoding the stored assignment."""
    renewed = renewal(group_id, request, settings)
    if renewed is None:
        return None
    return await heartbeat.renewals_of(engine).renew(renewed)


def may_wait(watch: MembershipWatch, body: HeartbeatRequest) -> bool:
    """Whether the heartbeat's reply may be held: the member offered to wait, and this
    replica hears the changes that would end the wait."""
    return (
        watch.listening
        and bool(body.wait_ms)
        and body.member_id is not None
        and body.member_epoch > 0
    )


def skips_renewal(watch: MembershipWatch, group_id: str, body: HeartbeatRequest) -> bool:
    """Whether the request goes past the renewal at once: its member is remembered as
    unsettled, so its renewal is sure to fail (forgotten either way, so that it skips one
    renewal at most for what was remembered)."""
    return body.member_id is not None and watch.take_unsettled(group_id, body.member_id)


async def answer(
    state: Any,
    scope: Scope,
    group_id: str,
    body: HeartbeatRequest,
    arrived: float | None = None,
    renew: bool = True,
) -> HeartbeatReply | bytes:
    """The reply to a validated heartbeat request from the ASGI doors: a model, or the
    renewal's JSON bytes.

    Partition counts of newly subscribed topics are learnt from Kafka first, before the
    request's transaction opens, so no group lock is ever held across a Kafka call.

    ``arrived`` (the event loop's clock when the request started being served; now when not
    given) is where a held reply's wait is counted from: the member offered to wait
    ``wait_ms`` for its reply, so the time spent serving the heartbeat (the renewal's turn
    in a batch, a locked path's turn) is part of the wait, not added to it. ``renew`` false
    skips the stable member's renewal, for a request whose renewal already found the member
    not stable."""
    if arrived is None:
        arrived = asyncio.get_running_loop().time()
    settings = state.settings
    check_endpoint(body.endpoint, settings.allowed_endpoint_hosts)
    engine = state.engine
    await heartbeat.learn_subscribed_topics(
        engine, getattr(state, "cluster", None), body, state.stored_topics
    )
    watch: MembershipWatch = state.membership_watch
    held: HeldHeartbeat | None = None
    if may_wait(watch, body):
        assert body.member_id is not None
        held = watch.hold(group_id, body.member_id)
    if skips_renewal(watch, group_id, body):
        renew = False
    try:
        stable = await stable_heartbeat(engine, group_id, body, settings) if renew else None
        if stable is not None:
            if held is not None:
                interval_ms = heartbeat.heartbeat_interval(stable.session_timeout_ms, settings)
                await _wait_for_change(held, STABLE_HOLD, body, interval_ms, arrived)
            # A reply that waited took the place of the member's sleep: it heartbeats again
            # at once, whether the wait ended on a change or ran out.
            return heartbeat.stable_reply(body, stable, settings, heartbeat_now=held is not None)
        locked = await _stepped(state, scope, group_id, body)
        reply = locked.reply
        if locked.unsettled:
            watch.remember_unsettled(group_id, reply.member_id)
        else:
            watch.forget_unsettled(group_id, reply.member_id)
        if held is not None and locked.hold is not None:
            await _wait_for_change(held, locked.hold, body, reply.heartbeat_interval_ms, arrived)
            reply.heartbeat_now = True
        return reply
    finally:
        if held is not None:
            watch.release(group_id, held)


async def _stepped(
    state: Any, scope: Scope, group_id: str, body: HeartbeatRequest
) -> heartbeat.LockedAnswer:
    """The step's answer: on the own-row path when it may and does serve the request, else
    on the locked path."""
    settings = state.settings
    engine = state.engine
    client = scope.get("client")
    client_host = client[0] if client else None
    principal_scope = admitted(scope).group_scope(group_id)
    if first_path(body) is not HeartbeatPath.LOCKED:
        own_row = await heartbeat.unlocked_heartbeat(engine, group_id, body, settings, client_host)
        if own_row is not None:
            return own_row
    turns: GroupTurns = state.group_turns
    async with turns.turn(group_id), engine.begin() as connection:
        return await heartbeat.heartbeat(
            connection, group_id, body, settings, client_host, principal_scope
        )


_CHANGED = metrics.HELD_HEARTBEATS.labels("changed")
_WAITED = metrics.HELD_HEARTBEATS.labels("waited")


async def _wait_for_change(
    held: HeldHeartbeat, hold: Hold, body: HeartbeatRequest, interval_ms: int, arrived: float
) -> None:
    metrics.HEARTBEATS_WAITING.inc()
    try:
        changed = await held.wait(hold, wait_deadline(body, interval_ms, arrived))
    finally:
        metrics.HEARTBEATS_WAITING.dec()
    count_wait(changed)


def wait_deadline(body: HeartbeatRequest, interval_ms: int, arrived: float) -> float:
    """When a held reply's wait ends (the loop's clock): as the member offered, at most its
    interval, both counted from the request's arrival."""
    assert body.wait_ms is not None
    return arrived + min(body.wait_ms, interval_ms) / 1000


def count_wait(changed: bool) -> None:
    """Count a held reply's wait, ended by a change or run out."""
    (_CHANGED if changed else _WAITED).inc()
