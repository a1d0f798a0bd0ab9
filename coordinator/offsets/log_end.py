"""``POST /v1/groups/{group_id}/offsets/out-of-range-reset``: a reader found its group's stored
position past the partition's log end and moves it to where its ``auto_offset_reset`` says
(docs/offsets.md, "Offsets outside the log").

The coordinator does not take the reader's word for it: it reads the high watermark itself
(from a fetch response, as for lag) and changes only a state that is past it, so of several
members sharing the partition the first one resets and the others find nothing to do. The
request is fenced like a commit: a member's at its current (or previous) epoch, a standalone
reader's only while the group has no live members.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.ext.asyncio import AsyncConnection

from client.protocol.committed import CommittedOffsets
from client.protocol.log_bounds import past_log_end
from coordinator.core.fence import commit_refusal
from coordinator.core.log_end import reset_past_log_end
from coordinator.db.engine import Transaction, driver_connection
from coordinator.db.switches import accept_individual_commit
from coordinator.errors import ServiceUnavailable
from coordinator.kafka import KafkaClusterError
from coordinator.offsets import repository
from coordinator.offsets.schemas import OffsetsReply
from coordinator.offsets.service import offsets_reply
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import (
    GroupId,
    MemberEpoch,
    MemberId,
    Offset,
    PartitionId,
    TopicName,
)

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/v1/groups", tags=["offsets"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)


class PartitionReset(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: TopicName
    partition: PartitionId
    offset: Offset


class OutOfRangeResetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    member_id: MemberId | None = None
    member_epoch: MemberEpoch | None = None
    partitions: Annotated[list[PartitionReset], Field(min_length=1, max_length=10_000)]

    @model_validator(mode="after")
    def _paired_identity(self) -> OutOfRangeResetRequest:
        if (self.member_id is None) != (self.member_epoch is None):
            raise ValueError("member_id and member_epoch go together")
        keys = {(entry.topic, entry.partition) for entry in self.partitions}
        if len(keys) != len(self.partitions):
            raise ValueError("a partition appears twice")
        return self


@router.post(
    "/{group_id}/offsets/out-of-range-reset",
    response_model=OffsetsReply,
    responses=problem_responses(400, 409, 503),
)
async def reset_out_of_range(
    request: Request,
    group_id: Annotated[GroupId, Path(description="Consumer group id")],
    body: OutOfRangeResetRequest,
    connection: Transaction,
) -> OffsetsReply:
    """Reset the named partitions whose stored state is past the log end; reply with the
    state of every named partition afterwards (reset or not)."""
    wanted = {(entry.topic, entry.partition): entry.offset for entry in body.partitions}
    high_watermarks = await _high_watermarks(request, list(wanted))
    topics = sorted({topic for topic, _ in wanted})
    states = {
        (item.topic, item.partition): item.state
        for item in await repository.read_partitions(connection, group_id, topics)
        if (item.topic, item.partition) in wanted
    }
    if any(
        past_log_end(state, high_watermarks[key])
        for key, state in states.items()
        if key in high_watermarks
    ):
        # Decided again under the locks: another reader may have reset it meanwhile.
        states.update(
            await _reset_locked(request, connection, group_id, body, wanted, high_watermarks)
        )
    return OffsetsReply(
        group_id=group_id,
        partitions=offsets_reply(
            [
                repository.StoredPartition(topic, partition, state)
                for (topic, partition), state in sorted(states.items())
            ]
        ),
    )


async def _reset_locked(
    request: Request,
    connection: AsyncConnection,
    group_id: str,
    body: OutOfRangeResetRequest,
    wanted: dict[tuple[str, int], int],
    high_watermarks: dict[tuple[str, int], int],
) -> dict[tuple[str, int], CommittedOffsets]:
    """Fence the request, lock the stored rows, and reset those past the log end."""
    driver = await driver_connection(connection)
    standalone = body.member_id is None
    committers = await repository.lock_committers(
        driver,
        [group_id] if standalone else [],
        [] if standalone else [(group_id, body.member_id or "")],
    )
    refused = commit_refusal(
        group_id,
        body.member_id,
        body.member_epoch,
        individual=False,
        accept_individual_commit=accept_individual_commit(
            committers.stored_switch, request.app.state.settings
        ),
        live_members=committers.live_members.get(group_id, 0),
        standing=committers.standings.get((group_id, body.member_id or "")),
    )
    if refused is not None:
        raise refused
    locked = await repository.lock_existing(
        driver, [(group_id, topic, partition) for topic, partition in wanted]
    )
    changed: dict[repository.GroupPartitionKey, CommittedOffsets] = {}
    for key, state in locked.items():
        _, topic, partition = key
        high = high_watermarks.get((topic, partition))
        if high is None:
            continue
        reset = reset_past_log_end(state, wanted[(topic, partition)], high, f"{topic}[{partition}]")
        if reset is not None:
            log.warning(
                "stored offsets past the log end reset",
                extra={
                    "group_id": group_id,
                    "topic": topic,
                    "partition": partition,
                    "stable_offset": state.stable_offset,
                    "high_watermark": high,
                    "to_offset": wanted[(topic, partition)],
                    "member_id": body.member_id,
                },
            )
            changed[key] = reset
    await repository.write_partitions(driver, changed)
    return {
        (topic, partition): state for (_, topic, partition), state in (locked | changed).items()
    }


async def _high_watermarks(
    request: Request, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    cluster = getattr(request.app.state, "cluster", None)
    if cluster is None:
        # Run without Kafka (offset storage only): no log end to judge by, so nothing is reset
        # and the reader, finding its state unchanged, says so.
        return {}
    try:
        marks: dict[tuple[str, int], int] = await cluster.high_watermarks(partitions)
    except KafkaClusterError as exc:
        raise ServiceUnavailable(f"cannot read the log ends to check the reset: {exc}") from None
    return marks
