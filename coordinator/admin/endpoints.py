"""Admin routes for offsets, groups and switches (docs/api.md). Every route needs the
admin scope; membership-specific admin routes live in coordinator/groups."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.admin import repository
from coordinator.admin.lag import admin_offsets
from coordinator.admin.reset import reset_group
from coordinator.admin.schemas import (
    AdminOffsets,
    CoordinatorConfigBody,
    CoordinatorConfigReply,
    DeletedReply,
    GroupList,
    GroupSummary,
    ResetReply,
    ResetRequest,
    TopicConfigBody,
    TopicConfigReply,
)
from coordinator.db.engine import Transaction
from coordinator.db.switches import read_switches
from coordinator.errors import GroupIdNotFound, GroupNotEmpty
from coordinator.groups import repository as groups_repository
from coordinator.offsets import repository as offsets_repository
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId, TopicName

log = logging.getLogger(__name__)

# Admin scope, checked by ``coordinator.auth.admit`` for every path under /v1/admin.
router = APIRouter(
    prefix="/v1/admin", tags=["admin"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)

Connection = Transaction
GroupPath = Annotated[GroupId, Path(description="Consumer group id")]


async def _require_group(connection: AsyncConnection, group_id: str, *, lock: bool) -> None:
    if not await repository.group_exists(connection, group_id, lock=lock):
        raise GroupIdNotFound(f"group '{group_id}' does not exist")


async def _require_empty(connection: AsyncConnection, group_id: str, action: str) -> None:
    live = await repository.count_live_members(connection, group_id)
    if live:
        raise GroupNotEmpty(
            f"cannot {action} while group '{group_id}' has {live} live member(s); stop them "
            "or wait for their sessions to expire",
            live_members=live,
        )


@router.get("/groups", response_model=GroupList, responses=problem_responses(503))
async def list_groups(connection: Connection) -> GroupList:
    rows = await repository.list_groups(connection)
    summaries = []
    for group_id, created_at, partitions, members, assignor in rows:
        summaries.append(
            GroupSummary(
                group_id=group_id,
                state="stable" if members else "empty",
                assignor=assignor,
                members=members,
                partitions=partitions,
                created_at=created_at,
            )
        )
    return GroupList(groups=summaries)


@router.delete(
    "/groups/{group_id}",
    response_model=DeletedReply,
    responses=problem_responses(400, 404, 409, 503),
)
async def delete_group(group_id: GroupPath, connection: Connection) -> DeletedReply:
    """Delete an empty group with its offsets; live members must leave first."""
    await _require_group(connection, group_id, lock=True)
    await _require_empty(connection, group_id, "delete the group")
    deleted = await repository.delete_group(connection, group_id)
    log.info("group deleted", extra={"group_id": group_id})
    return DeletedReply(deleted=deleted)


@router.get(
    "/groups/{group_id}/offsets",
    response_model=AdminOffsets,
    responses=problem_responses(400, 404, 503),
)
async def describe_offsets(
    request: Request,
    group_id: GroupPath,
    connection: Connection,
    topic: Annotated[list[TopicName] | None, Query()] = None,
) -> AdminOffsets:
    await _require_group(connection, group_id, lock=False)
    stored = await offsets_repository.read_partitions(connection, group_id, topic)
    return AdminOffsets(
        group_id=group_id, partitions=await admin_offsets(request, stored, group_id=group_id)
    )


@router.post(
    "/groups/{group_id}/offsets/reset",
    response_model=ResetReply,
    responses=problem_responses(400, 404, 409, 503),
)
async def reset_group_offsets(
    request: Request, group_id: GroupPath, body: ResetRequest, connection: Connection
) -> ResetReply:
    """Move stable offsets (backwards too) or drop IC ranges; only while the group is empty.
    With ``dry_run``, the same checks and the reply, nothing stored."""
    await _require_group(connection, group_id, lock=True)
    await _require_empty(connection, group_id, "reset offsets")
    return await reset_group(request, connection, group_id, body)


@router.delete(
    "/groups/{group_id}/offsets",
    response_model=DeletedReply,
    responses=problem_responses(400, 404, 409, 503),
)
async def delete_group_offsets(
    group_id: GroupPath, connection: Connection, topic: TopicName | None = None
) -> DeletedReply:
    await _require_group(connection, group_id, lock=True)
    await _require_empty(connection, group_id, "delete offsets")
    deleted = await offsets_repository.delete_offsets(connection, group_id, topic)
    log.info("offsets deleted", extra={"group_id": group_id, "topic": topic, "rows": deleted})
    return DeletedReply(deleted=deleted)


@router.get(
    "/topics/{topic}/config", response_model=TopicConfigReply, responses=problem_responses(400, 503)
)
async def get_topic_config(
    request: Request, topic: Annotated[TopicName, Path()], connection: Connection
) -> TopicConfigReply:
    explicit = await repository.get_topic_config(connection, topic)
    if explicit is not None:
        return TopicConfigReply(topic=topic, accept_range_fetch=explicit, explicit=True)
    switches = await read_switches(connection, request.app.state.settings)
    return TopicConfigReply(
        topic=topic, accept_range_fetch=switches.default_accept_range_fetch, explicit=False
    )


@router.put(
    "/topics/{topic}/config", response_model=TopicConfigReply, responses=problem_responses(400, 503)
)
async def put_topic_config(
    request: Request,
    topic: Annotated[TopicName, Path()],
    body: TopicConfigBody,
    connection: Connection,
) -> TopicConfigReply:
    before = await get_topic_config(request, topic, connection)
    await repository.set_topic_config(connection, topic, body.accept_range_fetch)
    # A member left idle by the switch (or sharing a partition it closes) must not wait for
    # the next join or leave to see it: its group recomputes on the next heartbeat.
    flagged = (
        await groups_repository.rebalance_subscribers(
            connection, [topic], "accept.range.fetch changed"
        )
        if before.accept_range_fetch != body.accept_range_fetch
        else []
    )
    log.info(
        "topic config set",
        extra={
            "topic": topic,
            "accept_range_fetch": body.accept_range_fetch,
            "groups_rebalanced": flagged,
        },
    )
    return TopicConfigReply(topic=topic, accept_range_fetch=body.accept_range_fetch, explicit=True)


@router.get("/config", response_model=CoordinatorConfigReply, responses=problem_responses(503))
async def get_config(request: Request, connection: Connection) -> CoordinatorConfigReply:
    switches = await read_switches(connection, request.app.state.settings)
    return CoordinatorConfigReply(
        accept_individual_commit=switches.accept_individual_commit,
        default_accept_range_fetch=switches.default_accept_range_fetch,
    )


@router.put("/config", response_model=CoordinatorConfigReply, responses=problem_responses(400, 503))
async def put_config(
    request: Request, body: CoordinatorConfigBody, connection: Connection
) -> CoordinatorConfigReply:
    switches = await read_switches(connection, request.app.state.settings)
    accept, default = switches.accept_individual_commit, switches.default_accept_range_fetch
    if body.accept_individual_commit is not None:
        accept = body.accept_individual_commit
    if body.default_accept_range_fetch is not None:
        default = body.default_accept_range_fetch
    await repository.set_switches(connection, accept, default)
    changed = (accept, default) != (
        switches.accept_individual_commit,
        switches.default_accept_range_fetch,
    )
    flagged = (
        await groups_repository.rebalance_subscribers(
            connection, None, "coordinator switches changed"
        )
        if changed
        else []
    )
    log.info(
        "coordinator switches set",
        extra={
            "accept_individual_commit": accept,
            "default_accept_range_fetch": default,
            "groups_rebalanced": flagged,
        },
    )
    return CoordinatorConfigReply(
        accept_individual_commit=accept, default_accept_range_fetch=default
    )
