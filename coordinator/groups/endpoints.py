"""The membership route: join, heartbeat and leave in one call (docs/api.md, docs/design.md §5)."""

from __future__ import annotations

import contextlib
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response

from coordinator import metrics
from coordinator.auth import authenticate
from coordinator.core.handoff import Hold
from coordinator.groups import heartbeat as membership
from coordinator.groups.schemas import HeartbeatReply, HeartbeatRequest
from coordinator.groups.watch import HeldHeartbeat, MembershipWatch
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId

router = APIRouter(
    prefix="/v1/groups", tags=["membership"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)

GroupPath = Annotated[GroupId, Path(description="Consumer group id")]

# A stable member's reply: it has nothing to do, so it may always wait for a change.
_STABLE = Hold(short_of_target=False)


async def _with_known_topics(request: Request, body: HeartbeatRequest) -> HeartbeatRequest:
    """Learns partition counts of newly subscribed topics from Kafka before the request's
    transaction opens, so no group lock is ever held across a Kafka call."""
    await membership.learn_subscribed_topics(
        request.app.state.engine, getattr(request.app.state, "cluster", None), body
    )
    return body


def _may_wait(watch: MembershipWatch, body: HeartbeatRequest) -> bool:
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
    request: Request,
    group_id: GroupPath,
    body: Annotated[HeartbeatRequest, Depends(_with_known_topics)],
) -> HeartbeatReply | Response:
    """Join (epoch 0), leave (epoch -1) or heartbeat; the reply carries the assignment.

    A heartbeat that offers ``wait_ms`` and has nothing to do is answered when something
    changes for its member, or when the wait runs out, after its transaction has committed
    (docs/membership.md, "Prompt hand-offs")."""
    settings = request.app.state.settings
    engine = request.app.state.engine
    watch: MembershipWatch = request.app.state.membership_watch
    with contextlib.ExitStack() as stack:
        held: HeldHeartbeat | None = None
        if _may_wait(watch, body):
            assert body.member_id is not None
            held = stack.enter_context(watch.holding(group_id, body.member_id))
        stable = await membership.stable_heartbeat(engine, group_id, body, settings)
        if stable is not None:
            if held is not None:
                interval_ms = membership.heartbeat_interval(stable.session_timeout_ms, settings)
                await _wait_for_change(held, _STABLE, body, interval_ms)
            # A reply that waited took the place of the member's sleep: it heartbeats again
            # at once, whether the wait ended on a change or ran out.
            return Response(
                membership.stable_reply(body, stable, settings, heartbeat_now=held is not None),
                media_type="application/json",
            )
        client_host = request.client.host if request.client is not None else None
        scope = authenticate(request).group_scope(group_id)
        async with engine.begin() as connection:
            reply, hold = await membership.heartbeat(
                connection, group_id, body, settings, client_host, scope
            )
        if held is not None and hold is not None:
            await _wait_for_change(held, hold, body, reply.heartbeat_interval_ms)
            reply.heartbeat_now = True
        return reply


async def _wait_for_change(
    held: HeldHeartbeat, hold: Hold, body: HeartbeatRequest, interval_ms: int
) -> None:
    """Wait as the member offered, at most its interval."""
    assert body.wait_ms is not None
    with metrics.HEARTBEATS_WAITING.track_inprogress():
        changed = await held.wait(hold, min(body.wait_ms, interval_ms) / 1000)
    metrics.HELD_HEARTBEATS.labels("changed" if changed else "waited").inc()
