"""Admin resets against the log end, and a reader's out-of-range reset, decided on values."""

from __future__ import annotations

import pytest

from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import KeyRange
from coordinator.core.log_end import reset_past_log_end, reset_refusal
from coordinator.errors import OffsetOutOfRange, UnknownTopicOrPartition


def test_a_reset_within_every_log_is_allowed() -> None:
    assert reset_refusal("t", [0, 1], 30, 2, {0: 30, 1: 80}) is None


def test_a_reset_past_a_log_end_names_each_partition_and_its_end() -> None:
    refused = reset_refusal("t", [0, 1, 2], 50, 3, {0: 30, 1: 80, 2: 40})
    assert isinstance(refused, OffsetOutOfRange)
    assert "t[0] ends at 30, t[2] ends at 40" in refused.detail
    assert refused.extra["high_watermarks"] == {"0": 30, "2": 40}


def test_a_partition_the_topic_lacks_or_a_missing_topic_is_refused() -> None:
    missing = reset_refusal("t", [0], 0, None, {})
    assert isinstance(missing, UnknownTopicOrPartition) and "does not exist" in missing.detail
    beyond = reset_refusal("t", [1, 4], 0, 2, {1: 5})
    assert isinstance(beyond, UnknownTopicOrPartition) and "[4]" in beyond.detail


def test_a_readers_reset_moves_only_a_state_past_the_end() -> None:
    inside = CommittedOffsets(stable_offset=20, ranges=((25, 26),))
    assert reset_past_log_end(inside, 0, 30, "t[0]") is None
    past = CommittedOffsets(
        stable_offset=20, watermarks=(Watermark(KeyRange.full().split(2)[0], 2_000),)
    )
    assert reset_past_log_end(past, 0, 30, "t[0]") == CommittedOffsets(stable_offset=0)


def test_a_readers_reset_past_the_end_itself_is_refused() -> None:
    with pytest.raises(OffsetOutOfRange, match="t\\[0\\] is past its log end 30"):
        reset_past_log_end(CommittedOffsets(stable_offset=2_000), 31, 30, "t[0]")
