"""Commit and fetch of individual-commit offsets (DESIGN §3, §3a).

The service decides; the repository talks SQL; the pure algebra in ``coordinator.core.offsets``
computes each partition's new state. The caller's transaction makes a request all-or-nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from client.committed import CommittedOffsets
from coordinator import metrics
from coordinator.core.offsets import (
    CommitOutcome,
    PartitionCommitResult,
    apply_classic_commit,
    apply_individual_commit,
)
from coordinator.errors import IndividualCommitNotAllowed, InvalidRequest
from coordinator.groups.fencing import commit_refusal
from coordinator.offsets import repository
from coordinator.offsets.schemas import (
    CommitReply,
    CommitRequest,
    PartitionCommitRequest,
    PartitionOffsetsReply,
)
from coordinator.settings import Settings

log = logging.getLogger(__name__)

_COMMITTED_BY_OUTCOME = {
    outcome: metrics.COMMITTED_PARTITIONS.labels(outcome=outcome.name.lower())
    for outcome in CommitOutcome
}

# Checks the committer's membership inside the commit's transaction; raises to refuse.
FencingCheck = Callable[[AsyncConnection, str, str | None, int | None], Awaitable[None]]


@dataclass(frozen=True)
class CommitResult:
    reply: CommitReply
    rebalance_needed: bool


def check_limits(request: CommitRequest, settings: Settings) -> None:
    if len(request.partitions) > settings.max_partitions_per_request:
        raise InvalidRequest(
            f"{len(request.partitions)} partitions in one commit; the limit is "
            f"{settings.max_partitions_per_request}"
        )
    total_ranges = sum(len(p.ranges) + len(p.watermarks) for p in request.partitions)
    if total_ranges > settings.max_ranges_per_request:
        raise InvalidRequest(
            f"{total_ranges} ranges and watermarks in one commit; the limit "
            f"(max_ranges_per_request) is {settings.max_ranges_per_request}: commit more often",
            limit=settings.max_ranges_per_request,
        )
    for entry in request.partitions:
        if entry.metadata is not None and len(entry.metadata) > settings.max_metadata_chars:
            raise InvalidRequest(
                f"metadata of {entry.topic}-{entry.partition} is {len(entry.metadata)} "
                f"characters; the limit is {settings.max_metadata_chars}"
            )


def _apply(
    entry: PartitionCommitRequest, state: CommittedOffsets, settings: Settings
) -> PartitionCommitResult:
    if entry.offset is not None:
        result = apply_classic_commit(state, entry.offset)
    else:
        result = apply_individual_commit(
            state,
            entry.ranges,
            entry.watermarks,
            max_ic_ranges=settings.max_ic_ranges_per_partition,
            max_watermark_pieces=settings.max_watermark_pieces_per_partition,
        )
    if entry.metadata is not None and result.state.metadata != entry.metadata:
        new_state = CommittedOffsets.of_pieces(
            result.state.stable_offset, result.state.ranges, result.state.pieces, entry.metadata
        )
        result = PartitionCommitResult(
            new_state, result.outcome, result.stable_offset_advanced, duplicate=False
        )
    return result


def refusal_for_switch(request: CommitRequest, accept_individual: bool) -> None:
    """Refuse ranges and watermarks while ``accept.individual.commit`` is off.

    Judged before membership, so a fenced member with an individual commit hears about the
    switch first, whichever path applied the commit.
    """
    if not accept_individual and any(p.ranges or p.watermarks for p in request.partitions):
        raise IndividualCommitNotAllowed(
            "the coordinator does not accept individual commits (accept.individual.commit is "
            "off); commit a plain offset"
        )


@dataclass(frozen=True)
class AppliedRequest:
    result: CommitResult
    changed: frozenset[tuple[str, int]]


def apply_request(
    group_id: str,
    request: CommitRequest,
    states: dict[tuple[str, int], CommittedOffsets],
    settings: Settings,
) -> AppliedRequest:
    """Apply an admitted request to the locked ``states`` in place.

    In place, so that several requests applied in one transaction each see the state the
    previous one left; the caller writes the keys in ``changed`` back.
    """
    replies: list[dict[str, object]] = []
    changed: set[tuple[str, int]] = set()
    rebalance_needed = False
    # Counted here and added once per request: a metric update takes a lock, and a request
    # carries several partitions.
    advanced = 0
    outcomes: dict[CommitOutcome, int] = {}
    for entry in request.partitions:
        key = (entry.topic, entry.partition)
        result = _apply(entry, states[key], settings)
        if not result.duplicate:
            states[key] = result.state
            changed.add(key)
        if result.outcome is CommitOutcome.MAX_REACHED:
            rebalance_needed = True
            log.warning(
                "partition holds too many individual-commit ranges",
                extra={"group_id": group_id, "topic": entry.topic, "partition": entry.partition},
            )
        elif result.duplicate:
            log.debug(
                "duplicate commit accepted",
                extra={"group_id": group_id, "topic": entry.topic, "partition": entry.partition},
            )
        advanced += result.stable_offset_advanced
        outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
        replies.append(
            {
                "topic": entry.topic,
                "partition": entry.partition,
                "error": result.outcome.error_name,
                "last_stable_offset": result.state.stable_offset,
            }
        )
    if advanced:
        metrics.STABLE_OFFSET_ADVANCES.inc(advanced)
    for outcome, count in outcomes.items():
        _COMMITTED_BY_OUTCOME[outcome].inc(count)
    return AppliedRequest(
        # One validation of the whole reply runs in pydantic's core, cheaper than a model
        # per partition built in Python.
        CommitResult(CommitReply.model_validate({"partitions": replies}), rebalance_needed),
        frozenset(changed),
    )


async def commit(
    connection: AsyncConnection,
    group_id: str,
    request: CommitRequest,
    settings: Settings,
    fencing: FencingCheck,
) -> CommitResult:
    """Apply ``request`` alone in the caller's transaction.

    The switch, the membership fence and the partition locks come from one statement;
    ``fencing`` runs on its own only when that statement could not read the membership (the
    group was created concurrently, after the statement's snapshot).
    """
    check_limits(request, settings)
    individual = any(p.ranges or p.watermarks for p in request.partitions)
    keys = [(p.topic, p.partition) for p in request.partitions]
    lock = await repository.lock_for_commit(
        connection,
        group_id,
        request.member_id,
        request.member_epoch,
        keys,
        individual,
        settings.accept_individual_commit,
    )
    refusal_for_switch(
        request,
        settings.accept_individual_commit if lock.stored_switch is None else lock.stored_switch,
    )
    states = lock.states
    if not lock.membership_read:
        await fencing(connection, group_id, request.member_id, request.member_epoch)
        states = await repository.lock_partitions(connection, group_id, keys)
    elif not states:
        raise commit_refusal(group_id, request.member_id, request.member_epoch, lock.fence)
    applied = apply_request(group_id, request, states, settings)
    await repository.write_partitions(
        connection, group_id, {key: states[key] for key in applied.changed}
    )
    metrics.COMMITS.inc()
    return applied.result


def offsets_reply(stored: Sequence[repository.StoredPartition]) -> list[PartitionOffsetsReply]:
    return [
        PartitionOffsetsReply(
            topic=item.topic,
            partition=item.partition,
            stable_offset=item.state.stable_offset,
            ranges=list(item.state.ranges),
            watermarks=list(item.state.pieces),
            metadata=item.state.metadata,
        )
        for item in stored
    ]
