"""The membership route: join, heartbeat and leave in one call (docs/api.md, docs/design.md §5)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from coordinator.db.engine import Transaction
from coordinator.groups import operations, serve
from coordinator.groups.schemas import GroupOwnersReply, HeartbeatReply, HeartbeatRequest
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId

router = APIRouter(
    prefix="/v1/groups", tags=["membership"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)

GroupPath = Annotated[GroupId, Path(description="Consumer group id")]


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
    ahead of FastAPI; declared here for OpenAPI and for requests under a root path.
    ``coordinator/groups/serve.py`` decides which path serves it."""
    reply = await serve.answer(request.app.state, request.scope, group_id, body)
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
