"""Admin routes for offsets, groups and switches (docs/api.md). Every route needs the
admin scope; membership-specific admin routes live in coordinator/groups."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from client.protocol.log_bounds import past_log_end
from coordinator.admin import repository
from coordinator.admin.schemas import (
    AdminOffsets,
    AdminPartitionOffsets,
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
from coordinator.core.log_end import reset_refusal
from coordinator.core.offsets import ic_offset_count, reset_offsets
from coordinator.db.engine import Transaction, driver_connection
from coordinator.db.switches import read_switches
from coordinator.errors import GroupIdNotFound, GroupNotEmpty, InvalidRequest, ServiceUnavailable
from coordinator.groups import repository as groups_repository
from coordinator.kafka import KafkaClusterError
from coordinator.offsets import repository as offsets_repository
from coordinator.offsets.repository import StoredPartition
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId, TopicName

log = logging.getLogger(__name__)

# Admin scope, checked by ``coordinator.auth.admit`` for every path under /v1/admin.
router = APIRouter(
    prefix="/v1/admin", tags=["admin"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)

Connection = Transaction
GroupPath = Annotated[GroupId, Path(description="Consumer group id")]


async def _high_watermarks(
    request: Request, stored: list[StoredPartition]
) -> dict[tuple[str, int], int]:
    """High watermarks when a Kafka cluster is configured and reachable; lag is optional."""
    cluster = getattr(request.app.state, "cluster", None)
    if cluster is None or not stored:
        return {}
    try:
        marks: dict[tuple[str, int], int] = await cluster.high_watermarks(
            [(item.topic, item.partition) for item in stored]
        )
    except Exception as exc:
        log.warning("high watermarks unavailable", extra={"error": type(exc).__name__})
        return {}
    return marks


async def admin_offsets(
    request: Request, stored: list[StoredPartition]
) -> list[AdminPartitionOffsets]:
    marks = await _high_watermarks(request, stored)
    result = []
    for item in stored:
        high = marks.get((item.topic, item.partition))
        past_end = high is not None and past_log_end(item.state, high)
        if high is None:
            lag = None
        elif past_end:
            # Every record of the log is unread by this group: what a reader reset to the log
            # start reads (exact for a log that starts at 0, as after a broker lost its data).
            lag = high
        else:
            lag = max(0, high - item.state.stable_offset)
        result.append(
            AdminPartitionOffsets(
                topic=item.topic,
                partition=item.partition,
                stable_offset=item.state.stable_offset,
                ranges=list(item.state.ranges),
                watermarks=list(item.state.pieces),
                metadata=item.state.metadata,
                ic_offsets=ic_offset_count(item.state),
                high_watermark=high,
                lag=lag,
                offset_out_of_range=past_end,
            )
        )
    return result


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
    return AdminOffsets(group_id=group_id, partitions=await admin_offsets(request, stored))


@router.post(
    "/groups/{group_id}/offsets/reset",
    response_model=ResetReply,
    responses=problem_responses(400, 404, 409, 503),
)
async def reset_group_offsets(
    request: Request, group_id: GroupPath, body: ResetRequest, connection: Connection
) -> ResetReply:
    """Move stable offsets (backwards too) or drop IC ranges; only while the group is empty."""
    await _require_group(connection, group_id, lock=True)
    await _require_empty(connection, group_id, "reset offsets")
    if body.to_offset is not None and body.partitions is None:
        stored = await offsets_repository.lock_existing_partitions(
            connection, group_id, body.topic, None
        )
        if not stored:
            raise InvalidRequest(
                f"group '{group_id}' has no offsets for topic '{body.topic}'; name the "
                "partitions to reset explicitly"
            )
        keys = sorted(stored)
    elif body.to_offset is not None and body.partitions is not None:
        keys = [(body.topic, p) for p in sorted(set(body.partitions))]
        locked = await offsets_repository.lock_partitions(
            await driver_connection(connection), [(group_id, t, p) for t, p in keys]
        )
        stored = {(topic, partition): state for (_, topic, partition), state in locked.items()}
    else:
        stored = await offsets_repository.lock_existing_partitions(
            connection, group_id, body.topic, body.partitions
        )
        keys = sorted(stored)
    if body.to_offset is not None and not body.force:
        await _check_reset_target(request, body.topic, [p for _, p in keys], body.to_offset)
    new_states = {key: reset_offsets(stored[key], body.to_offset) for key in keys}
    await offsets_repository.write_partitions(
        await driver_connection(connection),
        {(group_id, topic, partition): state for (topic, partition), state in new_states.items()},
    )
    log.info(
        "offsets reset",
        extra={"group_id": group_id, "topic": body.topic, "to_offset": body.to_offset},
    )
    result = [
        StoredPartition(topic, partition, new_states[(topic, partition)])
        for topic, partition in keys
    ]
    return ResetReply(group_id=group_id, partitions=await admin_offsets(request, result))


async def _check_reset_target(
    request: Request, topic: str, partitions: list[int], to_offset: int
) -> None:
    """Refuse a reset no reader could fetch from. A coordinator run without a Kafka cluster
    (tests, offset storage only) has nothing to check against; one whose cluster does not
    answer refuses, since the check is the point."""
    cluster = getattr(request.app.state, "cluster", None)
    if cluster is None:
        return
    try:
        counts = await cluster.partition_counts([topic])
        marks = await cluster.high_watermarks(
            [(topic, partition) for partition in partitions if partition < counts.get(topic, 0)]
        )
    except KafkaClusterError as exc:
        raise ServiceUnavailable(
            f"cannot read the log ends of '{topic}' to check the reset offset ({exc}); "
            "retry, or pass force to reset anyway"
        ) from None
    refused = reset_refusal(
        topic,
        partitions,
        to_offset,
        counts.get(topic),
        {partition: end for (_, partition), end in marks.items()},
    )
    if refused is not None:
        raise refused


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
