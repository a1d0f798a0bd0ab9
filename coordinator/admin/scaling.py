"""The desired-members figure for autoscaling a group's workers (docs/scaling.md, "Scaling
workers"): read by KEDA's metrics-api scaler, and exported as a Prometheus gauge."""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from coordinator import metrics
from coordinator.admin.schemas import ScalingReply
from coordinator.core.scaling import (
    ProgressHistory,
    ScalingPolicy,
    desired_members,
    group_progress,
)
from coordinator.db.engine import Transaction
from coordinator.errors import GroupIdNotFound, InvalidRequest
from coordinator.groups import metadata_repository, operations
from coordinator.kafka import KafkaClusterError
from coordinator.offsets import repository as offsets_repository
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId

log = logging.getLogger(__name__)

# Four polls at KEDA's default 30 s interval: long enough to smooth one commit interval
# landing or not, short enough to follow a change of pace within a couple of minutes.
RATE_WINDOW_S = 120.0

# Admin scope, checked by ``coordinator.auth.admit`` for every path under /v1/admin.
router = APIRouter(
    prefix="/v1/admin/groups", tags=["admin"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)


def _history(request: Request, group_id: str) -> ProgressHistory:
    """This replica's samples of the group. Each replica measures from the polls it serves:
    a rate needs no shared state, only two readings of the database some time apart."""
    histories: dict[str, ProgressHistory] = request.app.state.scaling_histories
    return histories.setdefault(group_id, ProgressHistory(window_s=RATE_WINDOW_S))


@router.get(
    "/{group_id}/scaling", response_model=ScalingReply, responses=problem_responses(400, 404, 503)
)
async def group_scaling(
    request: Request,
    group_id: Annotated[GroupId, Path(description="Consumer group id")],
    connection: Transaction,
    catch_up_seconds: Annotated[float, Query(gt=0, le=86_400)] = 60.0,
    min_members: Annotated[int, Query(ge=0)] = 1,
    max_members: Annotated[int | None, Query(ge=1)] = None,
) -> ScalingReply:
    """Members needed to work the group's lag off within ``catch_up_seconds`` at the
    per-member rate measured from its committed progress; not capped by partition count."""
    member_cap = request.app.state.settings.max_members_per_group
    upper = member_cap if max_members is None else min(max_members, member_cap)
    try:
        policy = ScalingPolicy(catch_up_seconds, min_members, upper)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    try:
        description = await operations.describe(connection, group_id)
    except GroupIdNotFound:
        request.app.state.scaling_histories.pop(group_id, None)
        raise
    stored = await offsets_repository.read_partitions(connection, group_id)
    topics = {topic for member in description.members for topic in member.subscribed_topics}
    counts = await metadata_repository.read_partition_counts(connection, topics)
    committed = {(item.topic, item.partition): item.state for item in stored}
    subscribed = [(topic, p) for topic, count in counts.items() for p in range(count)]
    wanted = sorted(set(committed) | set(subscribed))
    marks = await _high_watermarks(request, wanted)
    sample = group_progress(time.monotonic(), len(description.members), committed, marks, wanted)
    history = _history(request, group_id)
    history.add(sample)
    figure = desired_members(sample, history.processing_rate(), policy)
    metrics.GROUP_DESIRED_MEMBERS.labels(group_id).set(figure.desired_members)
    return ScalingReply(
        group_id=group_id,
        desired_members=figure.desired_members,
        reason=figure.reason,
        members=figure.members,
        lag=figure.lag,
        processing_rate=figure.processing_rate,
        member_rate=figure.member_rate,
        catch_up_seconds=policy.catch_up_s,
        min_members=policy.min_members,
        max_members=policy.max_members,
    )


async def _high_watermarks(
    request: Request, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """Log ends when a Kafka cluster is configured and answers; without them the lag is
    unknown and the figure holds the current count, which is also what a Kafka outage calls
    for (the workers cannot fetch either)."""
    cluster = getattr(request.app.state, "cluster", None)
    if cluster is None or not partitions:
        return {}
    try:
        marks: dict[tuple[str, int], int] = await cluster.high_watermarks(partitions)
    except KafkaClusterError as exc:
        log.warning("high watermarks unavailable", extra={"error": type(exc).__name__})
        return {}
    return marks
