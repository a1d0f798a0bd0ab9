"""Commit and fetch of individual-commit offsets (docs/design.md §3, §3a): the rules a request meets
between the HTTP shell and the database.

``check_limits`` runs once per request, before it is queued; commit batching
(``coordinator.offsets.batching``) judges the request by the fence in ``coordinator.core.fence``
and applies it with ``apply_request``, whose new states the pure algebra in
``coordinator.core.offsets`` computes. The batch's transaction makes a request all-or-nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from client.protocol.committed import CommittedOffsets
from coordinator import metrics
from coordinator.core.offsets import (
    MAX_REACHED,
    OK,
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


# One partition's line of a commit's reply: topic, partition, error name, last stable offset.
PartitionReply = tuple[str, int, str | None, int]


@dataclass(frozen=True)
class CommitResult:
    """A commit's per-partition outcomes, as plain tuples: the route writes them as JSON
    directly (``body``), which costs a fraction of building and dumping a ``CommitReply``."""

    partitions: tuple[PartitionReply, ...]
    rebalance_needed: bool

    @property
    def reply(self) -> CommitReply:
        """The reply as the route's declared model, for in-process callers."""
        return CommitReply.model_validate(
            {
                "partitions": [
                    {
                        "topic": topic,
                        "partition": partition,
                        "error": error,
                        "last_stable_offset": stable,
                    }
                    for topic, partition, error, stable in self.partitions
                ]
            }
        )

    def body(self) -> bytes:
        """The reply's JSON, byte for byte what ``reply.model_dump_json()`` writes (a test
        holds them equal), from fragments: a commit's reply is the route's per-request work."""
        return b'{"partitions":[%s]}' % b",".join(
            [
                _PARTITION_REPLY
                % (
                    _QUOTED_TOPICS.get(topic) or _quoted_topic(topic),
                    partition,
                    _QUOTED_ERRORS[error],
                    stable,
                )
                for topic, partition, error, stable in self.partitions
            ]
        )


_PARTITION_REPLY = b'{"topic":%s,"partition":%d,"error":%s,"last_stable_offset":%d}'
_QUOTED_ERRORS: dict[str | None, bytes] = {None: b"null"} | {
    outcome.error_name: json.dumps(outcome.error_name).encode()
    for outcome in CommitOutcome
    if outcome.error_name is not None
}
# Topic names as JSON strings, quoted once each; cleared when it grows past this many names
# (a coordinator serves a few thousand topics at most).
_QUOTED_TOPICS: dict[str, bytes] = {}
_QUOTED_TOPICS_MAX = 10_000


def _quoted_topic(topic: str) -> bytes:
    if len(_QUOTED_TOPICS) >= _QUOTED_TOPICS_MAX:
        _QUOTED_TOPICS.clear()
    # Topic names are ASCII letters, digits, '.', '_' and '-' (coordinator.validation), which
    # pydantic and json write alike.
    quoted = _QUOTED_TOPICS[topic] = json.dumps(topic, ensure_ascii=False).encode()
    return quoted


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
    entry: PartitionCommitRequest,
    state: CommittedOffsets,
    max_ic_ranges: int,
    max_watermark_pieces: int,
) -> PartitionCommitResult:
    if entry.offset is not None:
        result = apply_classic_commit(state, entry.offset)
    else:
        result = apply_individual_commit(
            state,
            entry.ranges,
            entry.watermarks,
            max_ic_ranges=max_ic_ranges,
            max_watermark_pieces=max_watermark_pieces,
        )
    if entry.metadata is not None and result.state.metadata != entry.metadata:
        new_state = CommittedOffsets.of_pieces(
            result.state.stable_offset, result.state.ranges, result.state.pieces, entry.metadata
        )
        result = PartitionCommitResult(
            new_state, result.outcome, result.stable_offset_advanced, duplicate=False
        )
    return result


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


# A batch's locked states, by (group, topic, partition).
States = dict[repository.GroupPartitionKey, CommittedOffsets]


async def apply_request(
    group_id: str,
    request: CommitRequest,
    states: States,
    changed: States,
    settings: Settings,
    tally: CommitTally,
) -> CommitResult:
    """Apply an admitted request to the locked ``states`` in place, giving other requests a
    turn now and then (``coordinator.offsets.pacing``), note the states it changed in
    ``changed`` for the caller to write back, and count its partitions' outcomes in ``tally``.

    In place, so that several requests applied in one transaction each see the state the
    previous one left. A request of one turn or less, which is nearly every one, is better
    applied by ``apply_small_request``, with no coroutine.
    """
    entries = request.partitions
    replies: list[PartitionReply] = []
    rebalance_needed = False
    for start in range(0, len(entries), PARTITIONS_PER_TURN):
        if start:
            await asyncio.sleep(0)
        rebalance_needed |= _apply_entries(
            group_id,
            entries[start : start + PARTITIONS_PER_TURN],
            states,
            changed,
            settings,
            tally,
            replies,
        )
    return CommitResult(tuple(replies), rebalance_needed)


def apply_small_request(
    group_id: str,
    request: CommitRequest,
    states: States,
    changed: States,
    settings: Settings,
    tally: CommitTally,
) -> CommitResult:
    """``apply_request`` for a request of at most ``PARTITIONS_PER_TURN`` partitions, in one
    go."""
    replies: list[PartitionReply] = []
    rebalance_needed = _apply_entries(
        group_id, request.partitions, states, changed, settings, tally, replies
    )
    return CommitResult(tuple(replies), rebalance_needed)


def _apply_entries(
    group_id: str,
    entries: Sequence[PartitionCommitRequest],
    states: States,
    changed: States,
    settings: Settings,
    tally: CommitTally,
    replies: list[PartitionReply],
) -> bool:
    """Apply ``entries`` to ``states``, adding their replies; whether one of them reached the
    limit of IC ranges (the client should rebalance)."""
    rebalance_needed = False
    advanced = 0
    # An enum member hashes in Python: the common outcome is counted without a dict.
    ok = 0
    outcomes = tally.outcomes
    max_ic_ranges = settings.max_ic_ranges_per_partition
    max_watermark_pieces = settings.max_watermark_pieces_per_partition
    for entry in entries:
        key = (group_id, entry.topic, entry.partition)
        result = _apply(entry, states[key], max_ic_ranges, max_watermark_pieces)
        state = result.state
        outcome = result.outcome
        if result.duplicate:
            log.debug(
                "duplicate commit accepted",
                extra={"group_id": group_id, "topic": entry.topic, "partition": entry.partition},
            )
        else:
            states[key] = changed[key] = state
        if outcome is OK:
            ok += 1
            replies.append((entry.topic, entry.partition, None, state.stable_offset))
        else:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            replies.append((entry.topic, entry.partition, outcome.value, state.stable_offset))
            if outcome is MAX_REACHED:
                rebalance_needed = True
                log.warning(
                    "partition holds too many individual-commit ranges",
                    extra={
                        "group_id": group_id,
                        "topic": entry.topic,
                        "partition": entry.partition,
                    },
                )
        advanced += result.stable_offset_advanced
    tally.advanced += advanced
    if ok:
        outcomes[OK] = outcomes.get(OK, 0) + ok
    return rebalance_needed


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
