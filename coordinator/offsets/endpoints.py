"""Client routes of the offset store (docs/api.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.auth import require_group_access
from coordinator.db.engine import transaction
from coordinator.errors import InvalidRequest
from coordinator.offsets import repository, service
from coordinator.offsets.batching import CommitBatcher
from coordinator.offsets.schemas import CommitReply, CommitRequest, OffsetsReply
from coordinator.validation import GroupId, PartitionQuery, TopicName

router = APIRouter(prefix="/v1/groups", tags=["offsets"])

GroupPath = Annotated[GroupId, Path(description="Consumer group id")]


@router.post("/{group_id}/offsets/commit", response_model=CommitReply)
async def commit_offsets(request: Request, group_id: GroupPath, body: CommitRequest) -> CommitReply:
    """Apply an individual or classic commit atomically; per-partition outcomes in the reply."""
    require_group_access(request, group_id)
    service.check_limits(body, request.app.state.settings)
    batcher: CommitBatcher = request.app.state.commits
    result = await batcher.submit(group_id, body)
    if result.rebalance_needed:
        # Flagged only once the commit's transaction is over: committers hold the group row
        # FOR SHARE, so updating it inside would deadlock two commits that both hit the cap.
        await request.app.state.on_max_ic_reached(group_id)
    return result.reply


@router.get("/{group_id}/offsets", response_model=OffsetsReply)
async def fetch_offsets(
    request: Request,
    group_id: GroupPath,
    connection: Annotated[AsyncConnection, Depends(transaction)],
    topic: Annotated[list[TopicName] | None, Query()] = None,
    partition: Annotated[list[PartitionQuery] | None, Query()] = None,
) -> OffsetsReply:
    """Committed state per partition; partitions never committed are absent."""
    require_group_access(request, group_id)
    if partition and (not topic or len(topic) != 1):
        raise InvalidRequest("filtering by 'partition' needs exactly one 'topic'")
    stored = await repository.read_partitions(connection, group_id, topic, partition)
    return OffsetsReply(group_id=group_id, partitions=service.offsets_reply(stored))
