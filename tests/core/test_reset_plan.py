"""Where an admin reset moves a partition in each mode (coordinator/core/reset_plan.py): the
rules of kafka-consumer-groups' --reset-offsets, which the CLI tests cannot all reach through
the embedded broker (its ListOffsets by time answers 0)."""

from __future__ import annotations

import pytest

from client.protocol.committed import CommittedOffsets
from coordinator.core.reset_plan import (
    LogFacts,
    ResetMode,
    ResetTarget,
    new_state,
    target_from_request,
)
from coordinator.errors import InvalidRequest, UnknownTopicOrPartition

LOG = LogFacts(log_start=10, log_end=50, at_time=None)
STORED = CommittedOffsets(stable_offset=30, ranges=[(32, 33)], metadata="m")


def offset_after(target: ResetTarget, facts: LogFacts = LOG) -> int:
    return new_state(target, "t[0]", STORED, facts).stable_offset


def test_the_request_names_at_most_one_target() -> None:
    assert target_from_request(None, False, False, None, None) == ResetTarget(ResetMode.DROP_RANGES)
    assert target_from_request(None, False, False, 5, None) == ResetTarget(ResetMode.TO_DATETIME, 5)
    with pytest.raises(InvalidRequest, match="name one reset target, not several"):
        target_from_request(3, True, False, None, None)


def test_earliest_and_latest_are_the_log_start_and_end() -> None:
    assert offset_after(ResetTarget(ResetMode.TO_EARLIEST)) == 10
    assert offset_after(ResetTarget(ResetMode.TO_LATEST)) == 50


def test_a_time_is_its_first_record_or_the_log_end_when_none_is_that_late() -> None:
    at = ResetTarget(ResetMode.TO_DATETIME, 1_000)
    assert offset_after(at, LogFacts(log_start=10, log_end=50, at_time=42)) == 42
    assert offset_after(at, LOG) == 50


def test_a_shift_moves_from_the_stored_offset_within_the_log() -> None:
    assert offset_after(ResetTarget(ResetMode.SHIFT_BY, -5)) == 25
    assert offset_after(ResetTarget(ResetMode.SHIFT_BY, -100)) == 10
    assert offset_after(ResetTarget(ResetMode.SHIFT_BY, 100)) == 50
    with pytest.raises(InvalidRequest, match="no offset stored"):
        new_state(ResetTarget(ResetMode.SHIFT_BY, 1), "t[0]", None, LOG)


def test_an_explicit_offset_is_taken_as_given() -> None:
    assert offset_after(ResetTarget(ResetMode.TO_OFFSET, 7)) == 7


def test_moving_clears_ranges_and_metadata_and_dropping_ranges_keeps_the_offset() -> None:
    moved = new_state(ResetTarget(ResetMode.TO_EARLIEST), "t[0]", STORED, LOG)
    assert (moved.stable_offset, moved.ranges, moved.metadata) == (10, (), None)
    dropped = new_state(ResetTarget(ResetMode.DROP_RANGES), "t[0]", STORED, LOG)
    assert (dropped.stable_offset, dropped.ranges, dropped.metadata) == (30, (), "m")


def test_a_partition_the_cluster_did_not_describe_is_named() -> None:
    with pytest.raises(UnknownTopicOrPartition, match=r"no log start for t\[0\]"):
        new_state(ResetTarget(ResetMode.TO_EARLIEST), "t[0]", STORED, LogFacts())
    with pytest.raises(UnknownTopicOrPartition, match=r"no log end for t\[0\]"):
        new_state(ResetTarget(ResetMode.TO_DATETIME, 0), "t[0]", STORED, LogFacts())
