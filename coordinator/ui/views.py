"""What the console's pages show, computed from the admin API's replies: the same figures
``keyrange admin`` and ``/v1/admin`` give, arranged for drawing. No I/O here."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from coordinator.admin.schemas import (
    AdminGroupDescription,
    AdminPartitionOffsets,
    GroupSummary,
    TopicConfigReply,
)
from coordinator.core.trend import GroupTrend, TrendSample, processed_estimate
from coordinator.groups.schemas import MemberDescription, SliceJson
from coordinator.ui.drawing import (
    UNOWNED_COLOUR,
    Chart,
    OffsetAxis,
    OffsetBand,
    Span,
    chart,
    key_range_span,
    member_colours,
    offset_axis,
    offset_bands,
    ownership_bar,
)

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class GroupRow:
    group_id: str
    state: str
    assignor: str | None
    members: int
    partitions: int
    total_lag: int | None


def group_rows(
    summaries: Sequence[GroupSummary], offsets: Sequence[Sequence[AdminPartitionOffsets]]
) -> list[GroupRow]:
    """One row per group; its total lag is known only when every partition's lag is."""
    return [
        GroupRow(
            group_id=summary.group_id,
            state=summary.state,
            assignor=summary.assignor,
            members=summary.members,
            partitions=summary.partitions,
            total_lag=total_lag([partition.lag for partition in partitions]),
        )
        for summary, partitions in zip(summaries, offsets, strict=True)
    ]


def total_lag(lags: Sequence[int | None]) -> int | None:
    """The sum of the partitions' lags; unknown when any is (or there is none to sum)."""
    if not lags or any(lag is None for lag in lags):
        return None
    return sum(lag for lag in lags if lag is not None)


@dataclass(frozen=True)
class MemberRow:
    member_id: str
    instance_id: str | None
    client_id: str | None
    client_host: str | None
    member_epoch: int
    last_heartbeat: datetime
    colour: str
    key_share: float
    stuck_calls: int


# A stuck call's mark on the key-space bar, in thousandths of the bar: wide enough to see
# for a single hash, kept inside the bar at its right end.
STUCK_MARK_WIDTH = 0.003


@dataclass(frozen=True)
class StuckMark:
    """A call still running on a key of a slice its member was asked to give up: the key's
    slice stays with that member until the call ends (docs/operations.md, "Stuck calls")."""

    member_id: str
    client_id: str | None
    colour: str
    key_hash: int
    offset: int
    running_for_s: float
    report_age_s: float
    summary: str
    at: float  # where the key hash sits on the key-space bar


@dataclass(frozen=True)
class BarSegment:
    first_hash: int
    last_hash: int
    owner: str | None
    colour: str
    span: Span


@dataclass(frozen=True)
class OffsetMark:
    """An IC range ``[first, last]`` or a watermark piece (hash range, offset) on the axis."""

    label: str
    span: Span
    hash_span: Span


@dataclass(frozen=True)
class OffsetsView:
    """A partition's committed offsets on its offset axis."""

    stable_offset: int
    high_watermark: int | None
    lag: int | None
    # Seconds since the oldest unprocessed record was written; None when none is unprocessed.
    oldest_unprocessed_age_s: float | None
    ic_offsets: int
    ic_range_count: int
    axis: OffsetAxis
    processed: Span
    pending: Span
    stable_at: float
    ic_bands: list[OffsetMark]
    watermark_pieces: list[OffsetMark]


@dataclass(frozen=True)
class PartitionView:
    topic: str
    partition: int
    segments: list[BarSegment]
    offsets: OffsetsView | None  # None: nothing committed yet
    stuck: list[StuckMark]


@dataclass(frozen=True)
class GroupPage:
    group_id: str
    state: str
    assignor: str | None
    group_epoch: int
    members: list[MemberRow]
    partitions: list[PartitionView]
    topics: list[TopicConfigReply]
    lag_chart: Chart
    rate_chart: Chart
    trend_minutes: int

    @property
    def empty(self) -> bool:
        return not self.members

    @property
    def stuck_calls(self) -> int:
        return sum(member.stuck_calls for member in self.members)

    @property
    def total_lag(self) -> int | None:
        return total_lag([view.offsets.lag for view in self.partitions if view.offsets])


def topics_of(description: AdminGroupDescription) -> list[str]:
    """Every topic the group reads or has offsets for, for the topic-config table."""
    topics = {partition.topic for partition in description.partitions}
    for member in description.members:
        topics.update(member.subscribed_topics)
        topics.update(owned.topic for owned in member.owned)
    return sorted(topics)


def trend_sample(description: AdminGroupDescription, at_s: float) -> TrendSample:
    """The group's figures now, for its trend: lag over the partitions whose high watermark
    is known (None with none), and progress as offsets processed (``processed_estimate``)."""
    lags = [item.lag for item in description.partitions if item.lag is not None]
    processed = sum(
        processed_estimate(item.stable_offset, item.ic_offsets, item.watermarks)
        for item in description.partitions
    )
    return TrendSample(at_s, sum(lags) if lags else None, processed)


def group_page(
    description: AdminGroupDescription,
    topic_configs: Sequence[TopicConfigReply],
    log_starts: Mapping[TopicPartition, int],
    trend: GroupTrend,
) -> GroupPage:
    colours = member_colours(member.member_id for member in description.members)
    owned: dict[TopicPartition, dict[str, list[tuple[int, int]]]] = defaultdict(dict)
    for member in description.members:
        for piece in member.owned:
            owned[(piece.topic, piece.partition)][member.member_id] = list(piece.ranges)
    offsets = {(item.topic, item.partition): item for item in description.partitions}
    stuck = _stuck_marks(description.members, colours)
    partitions = [
        _partition_view(
            key,
            owned.get(key, {}),
            offsets.get(key),
            log_starts.get(key, 0),
            colours,
            stuck.get(key, []),
        )
        for key in sorted(owned.keys() | offsets.keys() | stuck.keys())
    ]
    members = [
        MemberRow(
            member_id=member.member_id,
            instance_id=member.instance_id,
            client_id=member.client_id,
            client_host=member.client_host,
            member_epoch=member.member_epoch,
            last_heartbeat=member.last_heartbeat,
            colour=colours[member.member_id],
            key_share=_key_share(member.owned, len(partitions)),
            stuck_calls=len(member.stuck),
        )
        for member in sorted(description.members, key=lambda member: member.member_id)
    ]
    return GroupPage(
        group_id=description.group_id,
        state=description.state,
        assignor=description.assignor,
        group_epoch=description.group_epoch,
        members=members,
        partitions=partitions,
        topics=list(topic_configs),
        lag_chart=chart(trend.lag(), trend.window_s),
        rate_chart=chart(trend.rate(), trend.window_s),
        trend_minutes=round(trend.window_s / 60),
    )


def _stuck_marks(
    members: Iterable[MemberDescription], colours: dict[str, str]
) -> dict[TopicPartition, list[StuckMark]]:
    """Each partition's stuck calls, longest running first."""
    marks: dict[TopicPartition, list[StuckMark]] = defaultdict(list)
    for member in members:
        for call in member.stuck:
            marks[(call.topic, call.partition)].append(
                StuckMark(
                    member_id=member.member_id,
                    client_id=member.client_id,
                    colour=colours[member.member_id],
                    key_hash=call.key_hash,
                    offset=call.offset,
                    running_for_s=call.running_for_s,
                    report_age_s=call.report_age_s,
                    summary=call.summary,
                    at=min(
                        key_range_span(call.key_hash, call.key_hash).start, 1 - STUCK_MARK_WIDTH
                    ),
                )
            )
    for calls in marks.values():
        calls.sort(key=lambda mark: (-mark.running_for_s, mark.key_hash))
    return marks


def _key_share(owned: Iterable[SliceJson], partition_count: int) -> float:
    """The member's share of all the group's keys (every partition weighs the same)."""
    if partition_count == 0:
        return 0.0
    widths = sum(
        key_range_span(first, last).width for piece in owned for first, last in piece.ranges
    )
    return widths / partition_count


def _partition_view(
    key: TopicPartition,
    owners: dict[str, list[tuple[int, int]]],
    offsets: AdminPartitionOffsets | None,
    log_start: int,
    colours: dict[str, str],
    stuck: list[StuckMark],
) -> PartitionView:
    segments = [
        BarSegment(
            segment.first_hash,
            segment.last_hash,
            segment.owner,
            UNOWNED_COLOUR if segment.owner is None else colours[segment.owner],
            segment.span,
        )
        for segment in ownership_bar(owners)
    ]
    topic, partition = key
    view = None if offsets is None else _offsets_view(offsets, log_start)
    return PartitionView(topic, partition, segments, view, stuck)


def _offsets_view(offsets: AdminPartitionOffsets, log_start: int) -> OffsetsView:
    stable = offsets.stable_offset
    axis = offset_axis(
        stable, offsets.high_watermark, offsets.ranges, offsets.watermarks, log_start
    )
    return OffsetsView(
        stable_offset=stable,
        high_watermark=offsets.high_watermark,
        lag=offsets.lag,
        oldest_unprocessed_age_s=offsets.oldest_unprocessed_age_seconds,
        ic_offsets=offsets.ic_offsets,
        ic_range_count=len(offsets.ranges),
        axis=axis,
        processed=axis.span(axis.low, stable),
        pending=axis.span(stable, axis.high),
        stable_at=axis.position(stable),
        ic_bands=[_ic_mark(axis, band) for band in offset_bands(offsets.ranges, axis)],
        watermark_pieces=[_watermark_mark(axis, stable, piece) for piece in offsets.watermarks],
    )


def _ic_mark(axis: OffsetAxis, band: OffsetBand) -> OffsetMark:
    where = f"[{band.first:,}, {band.last:,}]"
    return OffsetMark(
        label=f"IC range {where}" if band.ranges == 1 else f"{band.ranges} IC ranges in {where}",
        span=axis.span(band.first, band.last + 1),
        hash_span=Span(0.0, 1.0),
    )


def _watermark_mark(axis: OffsetAxis, stable_offset: int, piece: Sequence[int]) -> OffsetMark:
    first_hash, last_hash, offset = piece
    return OffsetMark(
        label=f"watermark: hashes [{first_hash}, {last_hash}] processed below offset {offset:,}",
        span=axis.span(stable_offset, offset),
        hash_span=key_range_span(first_hash, last_hash),
    )
