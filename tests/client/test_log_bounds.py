"""The kernel's rules for positions outside a partition's log."""

from __future__ import annotations

import pytest

from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import KeyRange
from client.protocol.log_bounds import (
    committed_reach,
    out_of_range,
    past_log_end,
    reset_position,
)

LOWER, UPPER = KeyRange.full().split(2)


def test_the_log_end_itself_is_in_range_and_one_past_it_is_not() -> None:
    assert not out_of_range(30, 0, 30)
    assert out_of_range(31, 0, 30)
    assert out_of_range(9, 10, 30)
    assert not out_of_range(10, 10, 30)
    # An unknown bound decides nothing.
    assert not out_of_range(5, None, None)


def test_a_state_is_past_the_end_when_anything_it_claims_is() -> None:
    assert committed_reach(CommittedOffsets(stable_offset=7)) == 7
    ranged = CommittedOffsets(stable_offset=7, ranges=((40, 44),))
    assert committed_reach(ranged) == 45
    marked = CommittedOffsets(stable_offset=7, watermarks=(Watermark(LOWER, 60),))
    assert committed_reach(marked) == 60
    assert not past_log_end(ranged, 45)
    assert past_log_end(ranged, 44)
    assert past_log_end(marked, 59)


@pytest.mark.parametrize(("policy", "expected"), [("earliest", 10), ("latest", 30), ("none", None)])
def test_the_reset_position_follows_the_policy(policy: str, expected: int | None) -> None:
    assert reset_position(policy, 10, 30) == expected  # type: ignore[arg-type]
