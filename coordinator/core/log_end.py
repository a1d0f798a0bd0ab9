"""Stored offsets against the log they describe (docs/offsets.md, "Offsets outside the log").

Two decisions, both pure: whether an admin reset may move a partition to an offset (not past
its log end, not on a partition the topic does not have, unless forced), and how a reader's
out-of-range reset changes a stored state. The rule for "outside the log" is the kernel's
(``client/protocol/log_bounds.py``), shared with the SDK and the Spark source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from client.protocol.committed import CommittedOffsets
from client.protocol.log_bounds import out_of_range, past_log_end
from coordinator.core.offsets import reset_offsets
from coordinator.errors import KeyrangeError, OffsetOutOfRange, UnknownTopicOrPartition

_FORCE = "pass force (keyrange admin reset --force) to reset anyway"


def reset_refusal(
    topic: str,
    partitions: Sequence[int],
    to_offset: int,
    partition_count: int | None,
    high_watermarks: Mapping[int, int],
) -> KeyrangeError | None:
    """Why an admin reset of ``partitions`` to ``to_offset`` would leave an offset no reader
    can fetch from; None when it may go ahead. ``partition_count`` is None for a topic the
    cluster does not have."""
    if partition_count is None:
        return UnknownTopicOrPartition(
            f"topic '{topic}' does not exist in the Kafka cluster; {_FORCE}"
        )
    unknown = [partition for partition in partitions if partition >= partition_count]
    if unknown:
        return UnknownTopicOrPartition(
            f"topic '{topic}' has {partition_count} partition(s), not {unknown}; {_FORCE}",
            partitions=unknown,
        )
    past = {
        partition: high_watermarks[partition]
        for partition in partitions
        if partition in high_watermarks
        and out_of_range(to_offset, None, high_watermarks[partition])
    }
    if past:
        ends = ", ".join(f"{topic}[{p}] ends at {end}" for p, end in sorted(past.items()))
        return OffsetOutOfRange(
            f"offset {to_offset} is past the log end ({ends}); readers would skip every record "
            f"until the log grows past it; {_FORCE}",
            high_watermarks={str(p): end for p, end in sorted(past.items())},
        )
    return None


def reset_past_log_end(
    state: CommittedOffsets, to_offset: int, high_watermark: int, where: str
) -> CommittedOffsets | None:
    """A reader's out-of-range reset: the new state, or None when ``state`` is not past the log
    end (another reader of the partition reset it already, or the log has grown past it).

    The stable offset may move backwards here, unlike any commit (docs/design.md §3.6): a state past
    the log end was committed against records this log does not have, so it is no position
    in it, and keeping it would make every reader skip the log until it grows that far.
    """
    if out_of_range(to_offset, None, high_watermark):
        raise OffsetOutOfRange(
            f"reset offset {to_offset} of {where} is past its log end {high_watermark}",
            high_watermark=high_watermark,
        )
    if not past_log_end(state, high_watermark):
        return None
    return reset_offsets(state, to_offset)
