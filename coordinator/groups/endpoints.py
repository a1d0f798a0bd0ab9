"""The membership route: join, heartbeat and leave in one call (docs/api.md, DESIGN §5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from coordinator.groups import heartbeat as membership
from coordinator.groups.schemas import HeartbeatReply, HeartbeatRequest
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId

router = APIRouter(
    prefix="/v1/groups", tags=["membership"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)

GroupPath = Annotated[GroupId, Path(description="Consumer group id")]


async def _with_known_topics(request: Request, body: HeartbeatRequest) -> HeartbeatRequest:
    """Learns partition counts of newly subscribed topics from Kafka before the request's
    transaction opens, so no group lock is ever held across a Kafka call."""
    await membership.learn_subscribed_topics(
        request.app.state.engine, getattr(request.app.state, "cluster", None), body
    )
    return body


class TransactionWhenNeeded:
    """The request's transaction, begun on first use: most heartbeats are one autocommit
    statement and need none."""

    def __init__(self, engine: AsyncEngine, stack: AsyncExitStack) -> None:
        self.engine = engine
        self._stack = stack
        self._connection: AsyncConnection | None = None

    async def connection(self) -> AsyncConnection:
        if self._connection is None:
            self._connection = await self._stack.enter_async_context(self.engine.begin())
        return self._connection


async def transaction_when_needed(request: Request) -> AsyncIterator[TransactionWhenNeeded]:
    """Commits when the handler returns and rolls back when it raises, like the
    ``transaction`` dependency, if the handler began the transaction at all."""
    async with AsyncExitStack() as stack:
        yield TransactionWhenNeeded(request.app.state.engine, stack)


@router.post(
    "/{group_id}/heartbeat",
    response_model=HeartbeatReply,
    responses=problem_responses(400, 409, 503),
)
async def heartbeat(
    request: Request,
    group_id: GroupPath,
    # Declared before the transaction so FastAPI resolves it first (see its docstring).
    body: Annotated[HeartbeatRequest, Depends(_with_known_topics)],
    transaction: Annotated[TransactionWhenNeeded, Depends(transaction_when_needed)],
) -> HeartbeatReply | Response:
    """Join (epoch 0), leave (epoch -1) or heartbeat; the reply carries the assignment."""
    settings = request.app.state.settings
    stable = await membership.stable_heartbeat(transaction.engine, group_id, body, settings)
    if stable is not None:
        return Response(stable, media_type="application/json")
    client_host = request.client.host if request.client is not None else None
    connection = await transaction.connection()
    return await membership.heartbeat(connection, group_id, body, settings, client_host)
