"""Wire shapes of the admin routes (docs/api.md)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

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


class AdminOffsets(BaseModel):
    group_id: str
    partitions: list[AdminPartitionOffsets]


class ResetRequest(StrictModel):
    topic: TopicName
    partitions: list[PartitionId] | None = None
    to_offset: Offset | None = None
    force: bool = False


class ResetReply(BaseModel):
    group_id: str
    partitions: list[AdminPartitionOffsets]


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
