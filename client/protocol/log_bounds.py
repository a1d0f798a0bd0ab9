"""Positions outside a partition's log, and where a reader goes instead (docs/offsets.md,
"Offsets outside the log").

Kafka answers a fetch at a position below the log start or above the high watermark with
``OFFSET_OUT_OF_RANGE``, and the consumer applies ``auto.offset.reset``. Keyrange's stored
state can describe a log that no longer exists (a broker that lost its data, a topic
recreated under the same name), so the coordinator's admin view, its out-of-range reset, the
SDK and the Spark source all ask these rules and nothing else decides them.
"""

from __future__ import annotations

from typing import Literal, get_args

from client.protocol.committed import CommittedOffsets

OffsetReset = Literal["earliest", "latest", "none"]
OFFSET_RESETS: tuple[str, ...] = get_args(OffsetReset)


def committed_reach(state: CommittedOffsets) -> int:
    """The first offset past everything ``state`` says is processed: its stable offset, the
    end of its last IC range, or its highest watermark, whichever is highest."""
    reach = state.stable_offset
    if state.ranges:
        reach = max(reach, state.ranges[-1][1] + 1)
    for piece in state.watermarks:
        reach = max(reach, piece.offset)
    return reach


def past_log_end(state: CommittedOffsets, high_watermark: int) -> bool:
    """Whether ``state`` claims records the log does not have: it was committed against
    another log (the broker lost its data, or the topic was recreated), so no position it
    gives is one a reader can fetch from."""
    return committed_reach(state) > high_watermark


def out_of_range(position: int, log_start: int | None, high_watermark: int | None) -> bool:
    """Kafka's ``OFFSET_OUT_OF_RANGE``: below the log start or above the high watermark (the
    high watermark itself is the log end, where a reader waits for the next record)."""
    below = log_start is not None and position < log_start
    above = high_watermark is not None and position > high_watermark
    return below or above


def reset_position(policy: OffsetReset, log_start: int, high_watermark: int) -> int | None:
    """Where a reader outside the log resumes; None for ``none``, which the caller raises."""
    if policy == "earliest":
        return log_start
    if policy == "latest":
        return high_watermark
    return None
