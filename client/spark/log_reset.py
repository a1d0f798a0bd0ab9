"""The Spark source's ``auto_offset_reset``: a group's stored position, or a stream's
checkpointed one, past the partition's log end (the broker lost its data, the topic was
recreated) is reported and moved, never read as "nothing to do" (docs/spark.md); with
Spark's ``failOnDataLoss=true`` it fails the read instead.

The rule is the kernel's (``client/protocol/log_bounds.py``) and the stored state is moved by
the coordinator's out-of-range reset, as the SDK does, so a later report of this job's work
is not refused as too old. The job resets as a standalone reader: only while the group has no
live members, like its commits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import cast

from aiokafka.structs import TopicPartition

from client.errors import NoOffsetForPartition, OffsetOutOfRange
from client.http import CoordinatorClient
from client.protocol.committed import CommittedOffsets
from client.protocol.log_bounds import past_log_end, reset_position
from client.spark.kafka import ClusterView
from client.spark.options import SourceOptions
from client.spark.planning import Position

logger = logging.getLogger(__name__)


async def reset_committed_past_end(
    options: SourceOptions,
    view: ClusterView,
    committed: Mapping[TopicPartition, CommittedOffsets],
    log_starts: Mapping[TopicPartition, int],
) -> dict[TopicPartition, CommittedOffsets]:
    """The group's states, with those past the log end reset by the policy."""
    known = {tp: log_starts[tp] for tp in committed if tp in log_starts}
    ends = await view.latest(known)
    positions = {
        tp: state.stable_offset
        for tp, state in committed.items()
        if tp in ends and past_log_end(state, ends[tp])
    }
    if not positions:
        return dict(committed)
    targets = _targets(options, positions, log_starts, ends, "stored offset")
    return {**committed, **await _reset_on_coordinator(options, targets)}


async def reset_stream_past_end(
    options: SourceOptions,
    view: ClusterView,
    positions: Mapping[TopicPartition, Position],
    ends: Mapping[TopicPartition, int],
) -> dict[TopicPartition, Position]:
    """A stream's positions, with those past the log end restarted where the policy says.

    The restarted position gets a new origin, which tells the planner that the previous
    batch end belongs to a log that is gone.
    """
    past = {
        tp: position.next
        for tp, position in positions.items()
        if tp in ends and position.next > ends[tp]
    }
    if not past:
        return dict(positions)
    log_starts = await view.earliest(past)
    targets = _targets(options, past, log_starts, ends, "stream position")
    await _reset_on_coordinator(options, targets)
    return {**positions, **{tp: Position(target, target) for tp, target in targets.items()}}


async def start_by_policy(
    options: SourceOptions,
    view: ClusterView,
    stored: Mapping[TopicPartition, int],
    partitions: Sequence[TopicPartition],
    log_starts: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """Where each partition starts: the group's stored offset, or where ``auto_offset_reset``
    says for a partition the group never committed or whose offset is below the log start
    (records deleted by retention)."""
    starts = {tp: offset for tp, offset in stored.items() if offset >= log_starts[tp]}
    never = [tp for tp in partitions if tp not in stored]
    if never and options.auto_offset_reset == "none":
        raise NoOffsetForPartition(
            f"group {options.group} has no committed offset for "
            f"{', '.join(f'{tp.topic}[{tp.partition}]' for tp in never)}, and "
            "auto_offset_reset is 'none'"
        )
    outside = [tp for tp in partitions if tp not in starts]
    if not outside:
        return starts
    ends = await view.latest({tp: log_starts[tp] for tp in outside})
    for tp in outside:
        if tp in stored:
            starts.update(_targets(options, {tp: stored[tp]}, log_starts, ends, "stored offset"))
        else:
            starts[tp] = cast(
                int, reset_position(options.auto_offset_reset, log_starts[tp], ends[tp])
            )
    return starts


def _targets(
    options: SourceOptions,
    positions: Mapping[TopicPartition, int],
    log_starts: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
    what: str,
) -> dict[TopicPartition, int]:
    targets: dict[TopicPartition, int] = {}
    for tp, position in sorted(positions.items()):
        bound = (
            f"past its log end (high watermark {ends[tp]})"
            if position > ends[tp]
            else f"below its log start {log_starts[tp]} (records deleted)"
        )
        message = (
            f"{what} {position} of {tp.topic}[{tp.partition}] (group {options.group}) is {bound}"
        )
        target = reset_position(options.outside_log_reset, log_starts[tp], ends[tp])
        if target is None:
            raise OffsetOutOfRange(f"{message}, and {options.outside_log_rule}")
        logger.warning(
            "%s; applying auto_offset_reset=%s",
            message,
            options.outside_log_reset,
            extra={
                "group_id": options.group,
                "topic": tp.topic,
                "partition": tp.partition,
                "position": position,
                "log_start": log_starts[tp],
                "high_watermark": ends[tp],
                "auto_offset_reset": options.outside_log_reset,
            },
        )
        targets[tp] = target
    return targets


async def _reset_on_coordinator(
    options: SourceOptions, targets: Mapping[TopicPartition, int]
) -> dict[TopicPartition, CommittedOffsets]:
    if options.coordinator_url is None or options.group is None:
        return {}
    async with CoordinatorClient(options.coordinator_url, token=options.coordinator_token) as api:
        return await api.reset_out_of_range(options.group, targets)
