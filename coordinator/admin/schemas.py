"""Wire shapes of the admin routes (docs/api.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from client.protocol.committed import OFFSET_MAX
from coordinator.groups.schemas import GroupDescription
from coordinator.offsets.schemas import PartitionOffsetsReply
from coordinator.validation import Offset, PartitionId, TopicName


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GroupSummary(BaseModel):
    group_id: str
    state: str
    assignor: str | None
    members: int
    partitions: int
    created_at: datetime


class GroupList(BaseModel):
    groups: list[GroupSummary]


class AdminPartitionOffsets(PartitionOffsetsReply):
    ic_offsets: int
    high_watermark: int | None
    lag: int | None
    offset_out_of_range: bool = False
    # Seconds since the record at the stable offset was written; None when nothing is
    # unprocessed or Kafka could not say (docs/api.md).
    oldest_unprocessed_age_seconds: float | None = None


class AdminOffsets(BaseModel):
    group_id: str
    partitions: list[AdminPartitionOffsets]


class ResetRequest(StrictModel):
    """At most one target; none drops the IC ranges and watermarks only (docs/api.md)."""

    topic: TopicName
    # None: the partitions the group has offsets for; an empty list would read as that too.
    partitions: Annotated[list[PartitionId], Field(min_length=1)] | None = None
    to_offset: Offset | None = None
    to_earliest: bool = False
    to_latest: bool = False
    to_datetime: AwareDatetime | None = None
    shift_by: Annotated[int, Field(ge=-OFFSET_MAX, le=OFFSET_MAX, strict=True)] | None = None
    force: bool = False
    dry_run: bool = False


class ResetPartition(AdminPartitionOffsets):
    """A partition's state after the reset (planned, on a dry run), with the stable offset it
    had before: None where the group had none stored."""

    previous_offset: int | None


class ResetReply(BaseModel):
    group_id: str
    dry_run: bool
    partitions: list[ResetPartition]


class DeletedReply(BaseModel):
    deleted: int


class TopicConfigBody(StrictModel):
    accept_range_fetch: bool


class TopicConfigReply(BaseModel):
    topic: str
    accept_range_fetch: bool
    explicit: bool


class CoordinatorConfigBody(StrictModel):
    accept_individual_commit: bool | None = None
    default_accept_range_fetch: bool | None = None


class CoordinatorConfigReply(BaseModel):
    accept_individual_commit: bool
    default_accept_range_fetch: bool


class AdminGroupDescription(GroupDescription):
    """A group's membership (from the membership service) with its offsets and lag."""

    partitions: list[AdminPartitionOffsets]


class ScalingReply(BaseModel):
    """The desired-members figure KEDA's metrics-api scaler reads (valueLocation
    ``desired_members``), with what it was computed from."""

    group_id: str
    desired_members: int
    reason: str
    members: int
    # None while a partition's log end cannot be read from Kafka: the figure then holds.
    lag: int | None
    processing_rate: float | None
    member_rate: float | None
    catch_up_seconds: float
    min_members: int
    max_members: int
