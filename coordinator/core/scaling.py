"""How many members a group should have: the figure KEDA scales a worker Deployment on.

Kafka's own answer, and KEDA's Kafka scaler, stop at the partition count because a classic
consumer group cannot use more members than partitions. A Keyrange group can: members share a
partition by key range, so the only ceilings are the group's member cap and the operator's
maximum. The figure is therefore computed from throughput, not from partitions: the group's
lag divided by what one member works off in ``catch_up_s``, where a member's rate is measured
from the group's committed progress over time (docs/scaling.md, "Scaling workers").

Pure: the caller passes the clock and the figures it read; nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from client.protocol.committed import CommittedOffsets
from client.protocol.log_bounds import past_log_end
from coordinator.core.offsets import ic_offset_count

# A rate over less than a second is mostly the noise of one commit interval landing or not.
MIN_RATE_SPAN_S = 1.0

Reason = Literal["caught-up", "measuring", "stalled", "lag-unknown", "lag"]


@dataclass(frozen=True)
class ProgressSample:
    """One reading of a group: ``processed`` counts every offset committed as processed over
    all its partitions (stable offsets plus IC-range offsets), ``lag`` what is left to read,
    None when a partition's log end could not be read."""

    at_s: float
    processed: int
    lag: int | None
    members: int


TopicPartition = tuple[str, int]


def group_progress(
    at_s: float,
    members: int,
    committed: Mapping[TopicPartition, CommittedOffsets],
    high_watermarks: Mapping[TopicPartition, int],
    subscribed: Iterable[TopicPartition] = (),
) -> ProgressSample:
    """A sample from the stored offsets and the log ends.

    Lag counts records not processed yet: IC-range offsets are processed, so they are not lag
    even though the stable offset is below them. A subscribed partition with nothing committed
    is read from its start, as is one whose stored offset lies past its log end (the log was
    truncated or recreated); both lag by the whole log. One partition whose log end is unknown
    (no Kafka, a leaderless partition) makes the lag unknown rather than smaller.
    """
    processed = sum(state.stable_offset + ic_offset_count(state) for state in committed.values())
    lag: int | None = 0
    for partition in set(committed) | set(subscribed):
        high = high_watermarks.get(partition)
        if high is None or lag is None:
            lag = None
            continue
        state = committed.get(partition)
        if state is None or past_log_end(state, high):
            lag += high
        else:
            lag += max(0, high - state.stable_offset - ic_offset_count(state))
    return ProgressSample(at_s=at_s, processed=processed, lag=lag, members=members)


@dataclass(frozen=True)
class ScalingPolicy:
    """``catch_up_s``: how soon the current lag should be worked off; the bounds are the
    Deployment's replica bounds, so the figure is what the autoscaler will actually do."""

    catch_up_s: float
    min_members: int
    max_members: int

    def __post_init__(self) -> None:
        if self.catch_up_s <= 0:
            raise ValueError(f"catch_up_s must be positive, got {self.catch_up_s}")
        if not 0 <= self.min_members <= self.max_members:
            raise ValueError(
                f"need 0 <= min_members <= max_members, got {self.min_members} and "
                f"{self.max_members}"
            )

    def bounded(self, members: int) -> int:
        return max(self.min_members, min(self.max_members, members))


@dataclass(frozen=True)
class ScalingFigure:
    desired_members: int
    reason: Reason
    members: int
    lag: int | None
    # Records per second over the whole group, and per live member; None until measured.
    processing_rate: float | None
    member_rate: float | None


@dataclass
class ProgressHistory:
    """A group's recent samples, enough to measure its processing rate.

    Samples older than ``window_s`` are dropped, except the newest of them, which stays as the
    baseline: a poller slower than the window (KEDA behind several coordinator replicas, each
    seeing every Nth poll) still gets a rate, over a longer span. Progress that went backwards
    (an offset reset, the group deleted and recreated) starts the history again.
    """

    window_s: float
    samples: list[ProgressSample] = field(default_factory=list)

    def add(self, sample: ProgressSample) -> None:
        if self.samples and sample.processed < self.samples[-1].processed:
            self.samples.clear()
        self.samples.append(sample)
        horizon = sample.at_s - self.window_s
        older = [index for index, kept in enumerate(self.samples) if kept.at_s < horizon]
        if older:
            del self.samples[: older[-1]]

    def processing_rate(self) -> float | None:
        """Records per second from the oldest kept sample to the newest."""
        if len(self.samples) < 2:
            return None
        first, last = self.samples[0], self.samples[-1]
        span = last.at_s - first.at_s
        if span < MIN_RATE_SPAN_S:
            return None
        return (last.processed - first.processed) / span


def desired_members(
    latest: ProgressSample, processing_rate: float | None, policy: ScalingPolicy
) -> ScalingFigure:
    """Members to work the lag off within ``policy.catch_up_s`` at the measured per-member
    rate, within the policy's bounds.

    Without evidence the figure holds: an unknown lag, no rate measured yet, or members that
    committed nothing over the span (stuck on slow records, or just joined), keep the current
    count (at least one while there is lag, so a group scaled to zero wakes up). No lag means
    the minimum.
    """
    member_rate = (
        processing_rate / latest.members
        if processing_rate is not None and latest.members > 0
        else None
    )

    def figure(members: int, reason: Reason) -> ScalingFigure:
        return ScalingFigure(
            desired_members=policy.bounded(members),
            reason=reason,
            members=latest.members,
            lag=latest.lag,
            processing_rate=processing_rate,
            member_rate=member_rate,
        )

    if latest.lag is None:
        return figure(latest.members, "lag-unknown")
    if latest.lag <= 0:
        return figure(policy.min_members, "caught-up")
    holding = max(latest.members, 1)
    if member_rate is None:
        return figure(holding, "measuring")
    if member_rate <= 0:
        return figure(holding, "stalled")
    return figure(math.ceil(latest.lag / (member_rate * policy.catch_up_s)), "lag")
