"""The console's geometry: hash ranges onto the key-space bar, offsets onto the offset axis."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.protocol.keyspace import HASH_MAX
from coordinator.ui.drawing import (
    MEMBER_COLOURS,
    OffsetAxis,
    OffsetBand,
    Span,
    key_range_span,
    member_colours,
    offset_axis,
    offset_bands,
    ownership_bar,
)

HALF = 2**62


def test_the_whole_key_space_fills_the_bar() -> None:
    assert key_range_span(0, HASH_MAX) == Span(0.0, 1.0)


def test_the_upper_half_starts_in_the_middle() -> None:
    assert key_range_span(HALF, HASH_MAX) == Span(0.5, 0.5)


def test_a_range_outside_the_hash_space_is_refused() -> None:
    with pytest.raises(ValueError, match="not a range"):
        key_range_span(5, 4)
    with pytest.raises(ValueError, match="not a range"):
        key_range_span(0, HASH_MAX + 1)


def test_two_members_sharing_a_partition_split_the_bar_between_them() -> None:
    bar = ownership_bar({"b": [(HALF, HASH_MAX)], "a": [(0, HALF - 1)]})
    assert [(s.owner, s.first_hash, s.last_hash) for s in bar] == [
        ("a", 0, HALF - 1),
        ("b", HALF, HASH_MAX),
    ]
    assert [s.span for s in bar] == [Span(0.0, 0.5), Span(0.5, 0.5)]


def test_ranges_nobody_owns_are_drawn_as_unowned_gaps() -> None:
    bar = ownership_bar({"a": [(100, 199)], "b": [(300, 399)]})
    assert [(s.owner, s.first_hash, s.last_hash) for s in bar] == [
        (None, 0, 99),
        ("a", 100, 199),
        (None, 200, 299),
        ("b", 300, 399),
        (None, 400, HASH_MAX),
    ]


def test_a_partition_nobody_owns_is_one_unowned_segment() -> None:
    (segment,) = ownership_bar({})
    assert (segment.owner, segment.first_hash, segment.last_hash) == (None, 0, HASH_MAX)


def test_a_range_claimed_twice_is_drawn_once() -> None:
    bar = ownership_bar({"a": [(0, 199)], "b": [(100, HASH_MAX)]})
    assert [(s.owner, s.first_hash, s.last_hash) for s in bar] == [
        ("a", 0, 199),
        ("b", 200, HASH_MAX),
    ]


key_ranges = st.lists(
    st.tuples(st.integers(0, HASH_MAX), st.integers(0, HASH_MAX)).map(sorted), max_size=6
)


@given(st.dictionaries(st.sampled_from("abcd"), key_ranges, max_size=4))
def test_the_bar_covers_the_key_space_exactly_once_in_order(
    owned: dict[str, list[list[int]]],
) -> None:
    bar = ownership_bar(owned)
    assert bar[0].first_hash == 0
    assert bar[-1].last_hash == HASH_MAX
    for before, after in itertools.pairwise(bar):
        assert after.first_hash == before.last_hash + 1
    assert sum(s.span.width for s in bar) == pytest.approx(1.0)


def test_member_colours_follow_the_sorted_member_ids_and_wrap_around() -> None:
    members = [f"m-{i:02d}" for i in range(len(MEMBER_COLOURS) + 1)]
    colours = member_colours(reversed(members))
    assert colours["m-00"] == MEMBER_COLOURS[0]
    assert colours["m-01"] == MEMBER_COLOURS[1]
    assert colours[members[-1]] == MEMBER_COLOURS[0]


def test_the_offset_axis_runs_over_the_log_from_its_start_to_the_high_watermark() -> None:
    axis = offset_axis(1_000, 2_000, [], [], log_start=500)
    assert axis == OffsetAxis(500, 2_000)
    assert axis.position(500) == 0.0
    assert axis.position(2_000) == 1.0
    assert axis.position(1_250) == pytest.approx(0.5)
    assert offset_axis(1_000, 2_000, [], []) == OffsetAxis(0, 2_000)


def test_ic_ranges_watermarks_and_offsets_beyond_the_log_widen_the_axis() -> None:
    assert offset_axis(10, 20, [(25, 29)], []).high == 30
    assert offset_axis(10, 20, [], [(0, 5, 40)]).high == 40
    assert offset_axis(10, None, [], []).high == 10
    # A stable offset below the log start (records deleted before the group read them).
    assert offset_axis(10, 200, [], [], log_start=100).low == 10


def test_a_caught_up_partition_reads_as_its_whole_log() -> None:
    """Not "9,999 … 10,001": the processed log and where it ends."""
    assert offset_axis(10_000, 10_000, [], []) == OffsetAxis(0, 10_000)
    axis = offset_axis(0, 0, [], [])
    assert axis == OffsetAxis(0, 1)
    assert axis.span(0, 1) == Span(0.0, 1.0)


def test_spans_are_clamped_to_the_axis() -> None:
    axis = OffsetAxis(100, 200)
    assert axis.span(150, 175) == Span(0.5, 0.25)
    assert axis.span(0, 50) == Span(0.0, 0.0)
    assert axis.span(190, 500) == Span(0.9, pytest.approx(0.1))


def test_ic_ranges_closer_than_the_drawn_resolution_become_one_band() -> None:
    axis = OffsetAxis(0, 100_000)
    ranges = [(300, 300), (100, 120), (150, 151), (50_000, 50_010)]
    assert offset_bands(ranges, axis) == [
        OffsetBand(100, 151, 2),
        OffsetBand(300, 300, 1),
        OffsetBand(50_000, 50_010, 1),
    ]


def test_a_partition_with_many_ic_ranges_draws_at_most_a_band_per_resolution_step() -> None:
    axis = OffsetAxis(0, 120_000)
    ranges = [(offset, offset) for offset in range(0, 120_000, 2)]
    bands = offset_bands(ranges, axis)
    assert len(bands) <= 1_000
    assert sum(band.ranges for band in bands) == len(ranges)
