"""Wire shapes of the commit and offset-fetch routes (docs/api.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from client.protocol.committed import OFFSET_MAX
from coordinator.validation import (
    STORABLE,
    GroupId,
    KeyHash,
    MemberEpoch,
    MemberId,
    Offset,
    PartitionId,
    TopicName,
)

OffsetRangeJson = tuple[Offset, Offset]
WatermarkJson = tuple[KeyHash, KeyHash, Offset]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PartitionCommitRequest(StrictModel):
    topic: TopicName
    partition: PartitionId
    ranges: list[OffsetRangeJson] = Field(default_factory=list)
    watermarks: list[WatermarkJson] = Field(default_factory=list)
    offset: Offset | None = None
    metadata: Annotated[str, StringConstraints(max_length=65_536), STORABLE] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PartitionCommitRequest:
        for start, end in self.ranges:
            if start > end:
                raise ValueError(f"offset range [{start}, {end}] has start > end")
            if end == OFFSET_MAX:
                # No record can sit at 2**63-1 (its next offset would overflow), and Postgres
                # stores the range half-open, so its bound would not fit in int8.
                raise ValueError("an offset range cannot end at 2**63-1; no record has that offset")
        for hash_start, hash_end, _ in self.watermarks:
            if hash_start > hash_end:
                raise ValueError(f"watermark key range [{hash_start}, {hash_end}] has start > end")
        individual = bool(self.ranges or self.watermarks)
        if individual and self.offset is not None:
            raise ValueError("a partition commit carries either 'offset' or ranges/watermarks")
        if not individual and self.offset is None:
            raise ValueError("a partition commit needs 'offset', 'ranges' or 'watermarks'")
        return self


class CommitRequest(StrictModel):
    member_id: MemberId | None = None
    member_epoch: MemberEpoch | None = None
    partitions: Annotated[list[PartitionCommitRequest], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_partitions(self) -> CommitRequest:
        seen: set[tuple[str, int]] = set()
        for entry in self.partitions:
            key = (entry.topic, entry.partition)
            if key in seen:
                raise ValueError(f"partition {entry.topic}-{entry.partition} appears twice")
            seen.add(key)
        if (self.member_id is None) != (self.member_epoch is None):
            raise ValueError("member_id and member_epoch go together")
        return self


class PartitionCommitReply(BaseModel):
    topic: str
    partition: int
    error: str | None
    last_stable_offset: int


class CommitReply(BaseModel):
    partitions: list[PartitionCommitReply]


class PartitionOffsetsReply(BaseModel):
    topic: str
    partition: int
    stable_offset: int
    ranges: list[tuple[int, int]]
    watermarks: list[tuple[int, int, int]]
    metadata: str | None


class OffsetsReply(BaseModel):
    group_id: GroupId
    partitions: list[PartitionOffsetsReply]
