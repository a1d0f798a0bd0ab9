"""The membership route: join, heartbeat and leave in one call (docs/api.md, docs/design.md §5)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from starlette.types import Scope

from coordinator import metrics
from coordinator.auth import admitted
from coordinator.core.handoff import Hold
from coordinator.db.engine import Transaction
from coordinator.groups import heartbeat as membership
from coordinator.groups import operations
from coordinator.groups.schemas import (
    GroupOwnersReply,
    HeartbeatReply,
    HeartbeatRequest,
    check_endpoint,
)
from coordinator.groups.turns import GroupTurns
from coordinator.groups.watch import HeldHeartbeat, MembershipWatch
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId

router = APIRouter(
    prefix="/v1/groups", tags=["membership"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)

GroupPath = Annotated[GroupId, Path(description="Consumer group id")]

# A stable member's reply: it has nothing to do, so it may always wait for a change.
STABLE_HOLD = Hold(short_of_target=False)


def may_wait(watch: MembershipWatch, body: HeartbeatRequest) -> bool:
    """Whether the heartbeat's reply may be held: the member offered to wait, and this
    replica hears the changes that would end the wait."""
    return (
        watch.listening
        and bool(body.wait_ms)
        and body.member_id is not None
        and body.member_epoch > 0
    )


@router.post(
    "/{group_id}/heartbeat",
    response_model=HeartbeatReply,
    responses=problem_responses(400, 409, 503),
)
async def heartbeat(
    request: Request, group_id: GroupPath, body: HeartbeatRequest
) -> HeartbeatReply | Response:
    """Join (epoch 0), leave (epoch -1) or heartbeat; the reply carries the assignment.

    A heartbeat that offers ``wait_ms`` and has nothing to do is answered when something
    changes for its member, or when the wait runs out, after its transaction has committed
    (docs/membership.md, "Prompt hand-offs"). Served by ``coordinator/groups/fast_path.py``
    ahead of FastAPI; declared here for OpenAPI and for requests under a root path."""
    reply = await answer(request.app.state, request.scope, group_id, body)
    if isinstance(reply, bytes):
        return Response(reply, media_type="application/json")
    return reply


@router.get(
    "/{group_id}/owners",
    response_model=GroupOwnersReply,
    responses=problem_responses(400, 404, 503),
)
async def group_owners(group_id: GroupPath, connection: Transaction) -> GroupOwnersReply:
    """Which live member owns which key ranges now, with the address it serves queries on.

    What a streams instance asks to route a query to a key's owner; any token that may use
    the group may read it, where the whole description (client hosts, stuck calls, lag)
    needs an admin token."""
    return await operations.owners(connection, group_id)


async def answer(
    state: Any,
    scope: Scope,
    group_id: str,
    body: HeartbeatRequest,
    arrived: float | None = None,
    renew: bool = True,
) -> HeartbeatReply | bytes:
    """The reply to a validated heartbeat request: a model, or the stable path's JSON bytes.

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
    await membership.learn_subscribed_topics(
        engine, getattr(state, "cluster", None), body, state.stored_topics
    )
    watch: MembershipWatch = state.membership_watch
    held: HeldHeartbeat | None = None
    if may_wait(watch, body):
        assert body.member_id is not None
        held = watch.hold(group_id, body.member_id)
    if body.member_id is not None and watch.take_unsettled(group_id, body.member_id):
        renew = False
    try:
        stable = (
            await membership.stable_heartbeat(engine, group_id, body, settings) if renew else None
        )
        if stable is not None:
            if held is not None:
                interval_ms = membership.heartbeat_interval(stable.session_timeout_ms, settings)
                await _wait_for_change(held, STABLE_HOLD, body, interval_ms, arrived)
            # A reply that waited took the place of the member's sleep: it heartbeats again
            # at once, whether the wait ended on a change or ran out.
            return membership.stable_reply(body, stable, settings, heartbeat_now=held is not None)
        client = scope.get("client")
        client_host = client[0] if client else None
        principal_scope = admitted(scope).group_scope(group_id)
        locked = (
            await membership.unlocked_heartbeat(engine, group_id, body, settings, client_host)
            if membership.may_skip_turn(body)
            else None
        )
        if locked is None:
            turns: GroupTurns = state.group_turns
            async with turns.turn(group_id), engine.begin() as connection:
                locked = await membership.heartbeat(
                    connection, group_id, body, settings, client_host, principal_scope
                )
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
