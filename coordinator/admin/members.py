"""Membership admin routes: describe a group, force a rebalance, remove a member."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from coordinator.admin.lag import admin_offsets
from coordinator.admin.schemas import AdminGroupDescription
from coordinator.db.engine import Transaction
from coordinator.groups import operations
from coordinator.groups.schemas import RebalanceReply, RemovedMemberReply
from coordinator.offsets import repository as offsets_repository
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId, MemberId

# Admin scope, checked by ``coordinator.auth.admit`` for every path under /v1/admin.
router = APIRouter(
    prefix="/v1/admin/groups", tags=["admin"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)

Connection = Transaction
GroupPath = Annotated[GroupId, Path(description="Consumer group id")]
MemberPath = Annotated[MemberId, Path(description="Member id")]


@router.get(
    "/{group_id}", response_model=AdminGroupDescription, responses=problem_responses(400, 404, 503)
)
async def describe_group(
    request: Request, group_id: GroupPath, connection: Connection
) -> AdminGroupDescription:
    """Members with their owned, assigned and target slices, and per-partition lag."""
    description = await operations.describe(connection, group_id)
    stored = await offsets_repository.read_partitions(connection, group_id)
    return AdminGroupDescription(
        **dict(description), partitions=await admin_offsets(request, stored, group_id=group_id)
    )


@router.post(
    "/{group_id}/rebalance",
    response_model=RebalanceReply,
    responses=problem_responses(400, 404, 503),
)
async def rebalance_group(
    request: Request, group_id: GroupPath, connection: Connection
) -> RebalanceReply:
    """Recompute target assignments now; members converge on their next heartbeats."""
    return await operations.force_rebalance(connection, group_id, request.app.state.settings)


@router.delete(
    "/{group_id}/members/{member_id}",
    response_model=RemovedMemberReply,
    responses=problem_responses(400, 404, 409, 503),
)
async def remove_member(
    request: Request, group_id: GroupPath, member_id: MemberPath, connection: Connection
) -> RemovedMemberReply:
    """Remove a member as if its session expired: its slices become free for the others."""
    return await operations.remove_member(
        connection, group_id, member_id, request.app.state.settings
    )
