"""Commit and fetch of individual-commit offsets (docs/design.md §3, §3a): the rules a request meets
between the HTTP shell and the database.

``check_limits`` runs once per request, before it is queued; commit batching
(``coordinator.offsets.batching``) judges the request by the fence in ``coordinator.core.fence``
and applies it with ``apply_request``, whose new states the pure algebra in
``coordinator.core.offsets`` computes. The batch's transaction makes a request all-or-nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from client.protocol.committed import CommittedOffsets
from coordinator import metrics
from coordinator.core.offsets import (
    CommitOutcome,
    PartitionCommitResult,
    apply_classic_commit,
    apply_individual_commit,
)
from coordinator.errors import InvalidRequest
from coordinator.offsets import repository
from coordinator.offsets.pacing import PARTITIONS_PER_TURN
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


@dataclass(frozen=True)
class AppliedRequest:
    result: CommitResult
    changed: frozenset[tuple[str, int]]


@dataclass
class CommitTally:
    """What the requests of one batch did to the metrics, added to them once per batch: a
    metric update takes a lock, and a batch carries many requests of several partitions."""

    requests: int = 0
    advanced: int = 0
    outcomes: dict[CommitOutcome, int] = field(default_factory=dict)

    def add_to_metrics(self) -> None:
        if self.requests:
            metrics.COMMITS.inc(self.requests)
        if self.advanced:
            metrics.STABLE_OFFSET_ADVANCES.inc(self.advanced)
        for outcome, count in self.outcomes.items():
            _COMMITTED_BY_OUTCOME[outcome].inc(count)


async def apply_request(
    group_id: str,
    request: CommitRequest,
    states: dict[tuple[str, int], CommittedOffsets],
    settings: Settings,
    tally: CommitTally,
) -> AppliedRequest:
    """Apply an admitted request to the locked ``states`` in place, giving other requests a
    turn now and then (``coordinator.offsets.pacing``), and count its partitions' outcomes
    in ``tally``.

    In place, so that several requests applied in one transaction each see the state the
    previous one left; the caller writes the keys in ``changed`` back.
    """
    replies: list[dict[str, object]] = []
    changed: set[tuple[str, int]] = set()
    rebalance_needed = False
    advanced = 0
    # An enum member hashes in Python: the common outcome is counted without a dict.
    ok = 0
    outcomes = tally.outcomes
    for index, entry in enumerate(request.partitions):
        if index and not index % PARTITIONS_PER_TURN:
            await asyncio.sleep(0)
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
        outcome = result.outcome
        if outcome is CommitOutcome.OK:
            ok += 1
        else:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        replies.append(
            {
                "topic": entry.topic,
                "partition": entry.partition,
                "error": None if outcome is CommitOutcome.OK else outcome.value,
                "last_stable_offset": result.state.stable_offset,
            }
        )
    if len(replies) > PARTITIONS_PER_TURN:
        await asyncio.sleep(0)
    tally.advanced += advanced
    if ok:
        outcomes[CommitOutcome.OK] = outcomes.get(CommitOutcome.OK, 0) + ok
    return AppliedRequest(
        # One validation of the whole reply runs in pydantic's core, cheaper than a model
        # per partition built in Python.
        CommitResult(CommitReply.model_validate({"partitions": replies}), rebalance_needed),
        frozenset(changed),
    )


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
