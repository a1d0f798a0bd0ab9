"""The membership route: join, heartbeat and leave in one call (docs/api.md, DESIGN §5)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.auth import require_group_access
from coordinator.db.engine import transaction
from coordinator.groups import service
from coordinator.groups.schemas import HeartbeatReply, HeartbeatRequest
from coordinator.validation import GroupId

router = APIRouter(prefix="/v1/groups", tags=["membership"])

GroupPath = Annotated[GroupId, Path(description="Consumer group id")]


async def _authorized_with_known_topics(
    request: Request, group_id: GroupPath, body: HeartbeatRequest
) -> HeartbeatRequest:
    """Checks access and learns partition counts of newly subscribed topics from Kafka before
    the request's transaction opens, so no group lock is ever held across a Kafka call."""
    require_group_access(request, group_id)
    await service.learn_subscribed_topics(
        request.app.state.engine, getattr(request.app.state, "cluster", None), body
    )
    return body


@router.post("/{group_id}/heartbeat", response_model=HeartbeatReply)
async def heartbeat(
    request: Request,
    group_id: GroupPath,
    # Declared before the transaction so FastAPI resolves it first (see its docstring).
    body: Annotated[HeartbeatRequest, Depends(_authorized_with_known_topics)],
    connection: Annotated[AsyncConnection, Depends(transaction)],
) -> HeartbeatReply | Response:
    """Join (epoch 0), leave (epoch -1) or heartbeat; the reply carries the assignment."""
    settings = request.app.state.settings
    stable = await service.stable_heartbeat(connection, group_id, body, settings)
    if stable is not None:
        return Response(stable, media_type="application/json")
    client_host = request.client.host if request.client is not None else None
    return await service.heartbeat(connection, group_id, body, settings, client_host)
