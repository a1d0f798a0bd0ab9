"""The write side: docs/design.md §3/§3a examples, edge cases, and a stateful model of every
commit kind."""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Sequence
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from client.protocol.committed import OFFSET_MAX, CommittedOffsets, Piece, Watermark
from client.protocol.keyspace import HASH_MAX, KeyRange
from coordinator.core.offsets import (
    CommitOutcome,
    PartitionCommitResult,
    _raise_one,
    _upper_envelope,
    apply_classic_commit,
    apply_individual_commit,
    ic_offset_count,
    reset_offsets,
)

HALF = 2**62  # first hash of the upper half of the hash space
ROOMY = 1_000_000  # a limit no test below reaches unless it means to


def watermark(start: int, end: int, offset: int) -> Watermark:
    return Watermark(KeyRange(start, end), offset)


def commit(
    state: CommittedOffsets,
    ranges: Sequence[tuple[int, int]] = (),
    watermarks: Sequence[Watermark] = (),
    *,
    max_ic_ranges: int = ROOMY,
    max_watermark_pieces: int = ROOMY,
) -> PartitionCommitResult:
    return apply_individual_commit(
        state,
        ranges,
        [(w.keys.start, w.keys.end, w.offset) for w in watermarks],
        max_ic_ranges=max_ic_ranges,
        max_watermark_pieces=max_watermark_pieces,
    )


# docs/design.md §3 and the KIP's illustration


def test_a_range_bridging_two_stored_ranges_merges_them() -> None:
    result = commit(CommittedOffsets(43, ((45, 47), (50, 50))), [(48, 49)])

    assert result.state == CommittedOffsets(43, ((45, 50),))
    assert result.outcome is CommitOutcome.OK and not result.stable_offset_advanced


def test_a_range_at_the_stable_offset_advances_it_past_the_contiguous_run() -> None:
    result = commit(CommittedOffsets(43, ((45, 47), (50, 50))), [(43, 44)])

    assert result.state == CommittedOffsets(48, ((50, 50),))
    assert result.stable_offset_advanced


def test_gap_amending_commit_leaves_the_other_slices_offset_as_the_stable_offset() -> None:
    # After fetching [40..50] with LSO 40 and IC [43-45],[48-49], the client commits the gaps;
    # offset 40 belonged to another slice, so the stable offset waits for that slice.
    fetched = CommittedOffsets(40, ((43, 45), (48, 49)))
    amended = commit(fetched, [(41, 42), (46, 47), (50, 50)])

    assert amended.state == CommittedOffsets(40, ((41, 50),))
    other_slice = commit(amended.state, [(40, 40)])
    assert other_slice.state == CommittedOffsets.empty(51)


def test_ranges_merge_on_overlap_and_on_adjacency_only() -> None:
    result = commit(CommittedOffsets(0, ((10, 12), (20, 22))), [(13, 14), (21, 25), (27, 27)])

    assert result.state.ranges == ((10, 14), (20, 25), (27, 27))


def test_a_commits_ranges_may_come_in_any_order_and_overlap() -> None:
    state = CommittedOffsets(0, ((3, 3), (10, 10), (20, 20), (40, 40)))
    result = commit(state, [(8, 25), (6, 7), (12, 13), (1, 1)])

    assert result.state.ranges == ((1, 1), (3, 3), (6, 25), (40, 40))


def test_a_commit_wholly_below_the_stable_offset_is_too_old_and_changes_nothing() -> None:
    state = CommittedOffsets(50, ((55, 56),))
    result = commit(state, [(10, 20), (49, 49)])

    assert result.outcome is CommitOutcome.TOO_OLD
    assert result.outcome.error_name == "INDIVIDUAL_COMMIT_TOO_OLD"
    assert result.state == state and not result.duplicate


def test_a_too_old_commit_still_applies_its_watermarks() -> None:
    result = commit(CommittedOffsets.empty(50), [(10, 20)], [watermark(0, HASH_MAX, 60)])

    assert result.outcome is CommitOutcome.TOO_OLD
    assert result.state == CommittedOffsets.empty(60)


def test_a_range_straddling_the_stable_offset_is_clipped_and_applied() -> None:
    result = commit(CommittedOffsets(50, ((60, 61),)), [(45, 55), (10, 20)])

    assert result.outcome is CommitOutcome.OK
    assert result.state == CommittedOffsets(56, ((60, 61),))


def test_a_duplicate_above_the_stable_offset_is_accepted_silently() -> None:
    state = CommittedOffsets(50, ((55, 60),), (watermark(0, 9, 70),))
    result = commit(state, [(56, 58)], [watermark(3, 4, 65)])

    assert result.outcome is CommitOutcome.OK and result.duplicate
    assert result.state == state


def test_an_empty_commit_is_neither_an_error_nor_a_duplicate() -> None:
    state = CommittedOffsets(5, ((7, 8),), metadata="m")
    result = commit(state)

    assert result.state == state
    assert result.outcome is CommitOutcome.OK
    assert not result.duplicate and not result.stable_offset_advanced


def test_too_many_ranges_refuses_the_ranges_but_keeps_the_watermarks() -> None:
    state = CommittedOffsets(0, ((10, 10), (20, 20)))
    result = commit(state, [(30, 30)], [watermark(0, 9, 5)], max_ic_ranges=2)

    assert result.outcome is CommitOutcome.MAX_REACHED
    assert result.outcome.error_name == "MAX_INDIVIDUAL_COMMIT_REACHED"
    assert result.state == CommittedOffsets(0, ((10, 10), (20, 20)), (watermark(0, 9, 5),))


def test_refused_ranges_still_let_full_space_watermarks_move_the_stable_offset() -> None:
    state = CommittedOffsets(0, ((10, 10), (20, 20)))
    result = commit(state, [(30, 30), (40, 40)], [watermark(0, HASH_MAX, 15)], max_ic_ranges=1)

    assert result.outcome is CommitOutcome.MAX_REACHED
    assert result.state == CommittedOffsets(15, ((20, 20),))


def test_a_commit_that_fills_gaps_is_accepted_even_above_the_range_limit() -> None:
    # The limit was lowered below what is stored: commits that do not grow the state must
    # still pass, or the stuck partition could never recover.
    state = CommittedOffsets(0, ((10, 10), (20, 20), (30, 30)))
    result = commit(state, [(11, 19)], max_ic_ranges=1)

    assert result.outcome is CommitOutcome.OK
    assert result.state.ranges == ((10, 20), (30, 30))


def test_a_commit_that_collapses_ranges_into_the_stable_offset_passes_the_limit() -> None:
    state = CommittedOffsets(0, ((2, 2), (4, 4)))
    result = commit(state, [(0, 1), (3, 3), (6, 6), (8, 8)], max_ic_ranges=2)

    assert result.outcome is CommitOutcome.OK
    assert result.state == CommittedOffsets(5, ((6, 6), (8, 8)))


def test_too_many_watermark_pieces_refuses_the_watermarks_but_keeps_the_ranges() -> None:
    state = CommittedOffsets(0, (), (watermark(0, 9, 5),))
    result = commit(state, [(0, 3)], [watermark(20, 29, 7)], max_watermark_pieces=1)

    assert result.outcome is CommitOutcome.MAX_REACHED
    assert result.state == CommittedOffsets(4, (), (watermark(0, 9, 5),))


# §3a key-range watermarks


def test_watermarks_move_the_stable_offset_only_once_they_cover_the_whole_hash_space() -> None:
    lower = commit(CommittedOffsets.empty(0), [], [watermark(0, HALF - 1, 100)])
    assert lower.state == CommittedOffsets(0, (), (watermark(0, HALF - 1, 100),))

    upper = commit(lower.state, [], [watermark(HALF, HASH_MAX, 80)])

    assert upper.stable_offset_advanced
    assert upper.state == CommittedOffsets(80, (), (watermark(0, HALF - 1, 100),))


def test_watermarks_keep_the_maximum_and_merge_equal_neighbours() -> None:
    state = CommittedOffsets(10, (), (watermark(0, 99, 30), watermark(200, 299, 20)))
    result = commit(state, [], [watermark(50, 249, 20), watermark(300, 399, 20)])

    assert result.state.watermarks == (
        watermark(0, 99, 30),
        watermark(100, 399, 20),
    )


def test_a_watermark_next_to_an_equal_piece_joins_it() -> None:
    state = CommittedOffsets(0, (), (watermark(0, 99, 20), watermark(300, 399, 20)))
    result = commit(state, [], [watermark(100, 199, 20), watermark(200, 299, 20)])

    assert result.state.watermarks == (watermark(0, 399, 20),)


def test_overlapping_watermarks_in_one_commit_take_the_maximum_per_hash() -> None:
    result = commit(
        CommittedOffsets.empty(0),
        [],
        [watermark(0, 100, 5), watermark(50, 60, 9), watermark(55, 200, 7)],
    )

    assert result.state.watermarks == (
        watermark(0, 49, 5),
        watermark(50, 60, 9),
        watermark(61, 200, 7),
    )


def test_watermarks_at_or_below_the_stable_offset_are_no_ops_not_errors() -> None:
    state = CommittedOffsets(50, (), (watermark(5, 6, 60),))
    result = commit(state, [], [watermark(0, HASH_MAX, 50), watermark(5, 6, 10)])

    assert result.outcome is CommitOutcome.OK and result.duplicate
    assert result.state == state


def test_interleaved_keys_committed_as_watermarks_keep_the_state_small() -> None:
    # Two members share a partition whose keys alternate; each commits one watermark per
    # slice. With IC ranges alone this would store one range per record of the slower one.
    slices = KeyRange.full().split(2)
    state = CommittedOffsets.empty(0)
    for position in range(1, 1001):
        fast = commit(state, [], [Watermark(slices[0], position * 2)])
        state = commit(fast.state, [], [Watermark(slices[1], position)]).state
        assert len(state.watermarks) <= 2 and not state.ranges

    assert state == CommittedOffsets(1000, (), (Watermark(slices[0], 2000),))


# classic commit and admin reset (§3.6)


def test_a_classic_commit_moves_forward_and_drops_what_it_passed() -> None:
    state = CommittedOffsets(10, ((12, 13), (20, 25)), (watermark(0, 9, 15), watermark(10, 19, 30)))
    result = apply_classic_commit(state, 16)

    assert result.stable_offset_advanced and result.outcome is CommitOutcome.OK
    assert result.state == CommittedOffsets(16, ((20, 25),), (watermark(10, 19, 30),))


def test_a_classic_commit_never_moves_the_stable_offset_backwards() -> None:
    state = CommittedOffsets(10, ((12, 13),))
    result = apply_classic_commit(state, 3)

    assert result.state == state
    assert not result.stable_offset_advanced and result.duplicate


def test_a_classic_commit_onto_a_stored_range_continues_past_it() -> None:
    result = apply_classic_commit(CommittedOffsets(10, ((15, 20), (30, 31))), 15)

    assert result.state == CommittedOffsets(21, ((30, 31),))


def test_a_classic_commit_keeps_the_metadata_for_the_caller_to_replace() -> None:
    assert apply_classic_commit(CommittedOffsets(1, metadata="m"), 5).state.metadata == "m"


def test_reset_to_an_offset_clears_everything_and_may_go_backwards() -> None:
    state = CommittedOffsets(50, ((55, 56),), (watermark(0, 9, 60),), metadata="m")

    assert reset_offsets(state, 20) == CommittedOffsets.empty(20)
    assert reset_offsets(state, None) == CommittedOffsets(50, metadata="m")


def test_ic_offset_count_sums_the_range_lengths() -> None:
    assert ic_offset_count(CommittedOffsets(0, ((2, 2), (5, 9)))) == 6
    assert ic_offset_count(CommittedOffsets(0, ((1, OFFSET_MAX),))) == OFFSET_MAX
    assert ic_offset_count(CommittedOffsets.empty(7)) == 0


# malformed input (defence in depth behind the HTTP layer)


@pytest.mark.parametrize("bad_range", [(5, 4), (-1, 3), (-3, -1), (0, OFFSET_MAX + 1)])
def test_malformed_ranges_raise_and_apply_nothing(bad_range: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="offset range"):
        commit(CommittedOffsets.empty(0), [(1, 2), bad_range])


@pytest.mark.parametrize(
    "bad_piece", [(9, 5, 3), (-1, 5, 3), (0, HASH_MAX + 1, 3), (0, 5, -1), (0, 5, OFFSET_MAX + 1)]
)
def test_malformed_watermarks_raise_and_apply_nothing(bad_piece: Piece) -> None:
    with pytest.raises(ValueError, match="watermark"):
        apply_individual_commit(
            CommittedOffsets.empty(0),
            [],
            [(0, 5, 3), bad_piece],
            max_ic_ranges=ROOMY,
            max_watermark_pieces=ROOMY,
        )


@pytest.mark.parametrize("bad_offset", [-1, OFFSET_MAX + 1])
def test_classic_commit_and_reset_reject_offsets_outside_int64(bad_offset: int) -> None:
    with pytest.raises(ValueError, match="committed offset"):
        apply_classic_commit(CommittedOffsets.empty(0), bad_offset)
    with pytest.raises(ValueError, match="reset offset"):
        reset_offsets(CommittedOffsets.empty(0), bad_offset)


# limits of int64 and of commit sizes


def test_a_range_ending_at_int64_max_caps_the_stable_offset() -> None:
    near_end = CommittedOffsets.empty(OFFSET_MAX - 10)
    stored = commit(near_end, [(OFFSET_MAX, OFFSET_MAX)])
    assert stored.state.ranges == ((OFFSET_MAX, OFFSET_MAX),)

    filled = commit(stored.state, [(OFFSET_MAX - 10, OFFSET_MAX - 1)])

    assert filled.state == CommittedOffsets.empty(OFFSET_MAX)


def test_a_full_space_watermark_at_int64_max_moves_the_stable_offset_there() -> None:
    edges = [watermark(0, 0, OFFSET_MAX), watermark(1, HASH_MAX, OFFSET_MAX)]
    result = commit(CommittedOffsets.empty(0), [], edges)

    assert result.state == CommittedOffsets.empty(OFFSET_MAX)


def test_a_watermark_on_the_last_hash_alone_leaves_the_stable_offset() -> None:
    result = commit(CommittedOffsets.empty(0), [], [watermark(HASH_MAX, HASH_MAX, 9)])

    assert result.state == CommittedOffsets(0, (), (watermark(HASH_MAX, HASH_MAX, 9),))
    assert result.state.is_processed(8, HASH_MAX) and not result.state.is_processed(8, 0)


def test_huge_ranges_merge_without_enumerating_offsets() -> None:
    state = CommittedOffsets(0, ((10, 2**40),))
    result = commit(state, [(2**40 + 1, 2**62), (2**62 + 2, OFFSET_MAX)])

    assert result.state.ranges == ((10, 2**62), (2**62 + 2, OFFSET_MAX))
    assert ic_offset_count(result.state) == OFFSET_MAX - 10
    assert commit(result.state, [(0, 2**62 + 1)]).state == CommittedOffsets.empty(OFFSET_MAX)


def test_sixty_thousand_ranges_in_one_commit_merge_with_ten_thousand_stored() -> None:
    shuffle = random.Random(7)
    stored = tuple((offset, offset) for offset in range(1, 40_000, 4))  # 10,000 ranges
    every_other = [(offset, offset) for offset in range(3, 240_000, 4)]  # 60,000 ranges
    shuffle.shuffle(every_other)

    result = commit(CommittedOffsets(0, stored), every_other)

    expected = tuple((offset, offset) for offset in range(1, 40_000, 2)) + tuple(
        (offset, offset) for offset in range(40_003, 240_000, 4)
    )
    assert result.outcome is CommitOutcome.OK and result.state.ranges == expected
    gaps = [(offset, offset + 1) for offset in range(0, 240_000, 2)]
    shuffle.shuffle(gaps)
    assert commit(result.state, gaps).state == CommittedOffsets.empty(240_000)


# The model: records (offset, hash); the marked offsets (IC ranges and classic commits) and the
# watermarks applied so far; everything else is derived naively and compared exactly.

RECORDS = 64
MAX_RANGES = 4
MAX_PIECES = 4
HASHES = [0, 1, 2**61, HALF - 1, HALF, HALF + 7, HASH_MAX - 1, HASH_MAX]
HASH_BOUNDS = sorted(
    {0, HASH_MAX}
    | set(HASHES)
    | {h + 1 for h in HASHES if h < HASH_MAX}
    | {h - 1 for h in HASHES if h}
)

QUARTERS = KeyRange.full().split(4)


def quarters_between(pair: tuple[int, int]) -> KeyRange:
    return KeyRange(QUARTERS[min(pair)].start, QUARTERS[max(pair)].end)


def hashes_between(pair: tuple[int, int]) -> KeyRange:
    return KeyRange(min(pair), max(pair))


# Members commit per slice, so aligned neighbours with equal W are common; odd edges next to
# the record hashes probe the boundaries.
key_ranges = (
    st.just(KeyRange.full())
    | st.tuples(st.integers(0, 3), st.integers(0, 3)).map(quarters_between)
    | st.tuples(st.sampled_from(HASH_BOUNDS), st.sampled_from(HASH_BOUNDS)).map(hashes_between)
)
# Offsets are drawn relative to the current stable offset, where all the behaviour is: a
# slightly negative distance probes TOO_OLD and no-op watermarks; few distinct watermark
# distances make equal neighbours common.
RelativeRange = tuple[int, int]  # (distance of the start from the stable offset, length - 1)
RelativeWatermark = tuple[KeyRange, int]  # (keys, distance of W from the stable offset)
relative_ranges = st.tuples(st.integers(-4, 10), st.integers(0, 3))
relative_watermarks = st.tuples(key_ranges, st.sampled_from([2, 4, 6]) | st.integers(-3, 10))


class Model:
    """Offsets marked by ranges and classic commits, and every watermark ever applied."""

    def __init__(self, marked: frozenset[int] = frozenset(), raises: tuple[Watermark, ...] = ()):
        self.marked = marked
        self.raises = raises
        cuts = sorted(
            {0}
            | {w.keys.start for w in raises}
            | {w.keys.end + 1 for w in raises if w.keys.end < HASH_MAX}
        )
        # The hash space cut at every watermark edge; W is constant on each segment.
        self.cuts = cuts
        self.segment_w = [
            max((w.offset for w in raises if w.keys.contains(cut)), default=0) for cut in cuts
        ]

    def raised_w(self, key_hash: int) -> int:
        return self.segment_w[bisect_right(self.cuts, key_hash) - 1]

    def segments(self) -> list[tuple[int, int, int]]:
        ends = [cut - 1 for cut in self.cuts[1:]] + [HASH_MAX]
        return list(zip(self.cuts, ends, self.segment_w, strict=True))

    def stable_offset(self) -> int:
        full_space_min = min(self.segment_w)
        offset = 0
        while offset in self.marked or offset < full_space_min:
            offset += 1
        return offset

    def canonical(self) -> CommittedOffsets:
        stable = self.stable_offset()
        ranges: list[tuple[int, int]] = []
        for offset in sorted(o for o in self.marked if o > stable):
            if ranges and ranges[-1][1] + 1 == offset:
                ranges[-1] = (ranges[-1][0], offset)
            else:
                ranges.append((offset, offset))
        pieces: list[Watermark] = []
        for start, end, w in self.segments():
            if w <= stable:
                continue
            if pieces and pieces[-1].keys.end + 1 == start and pieces[-1].offset == w:
                pieces[-1] = watermark(pieces[-1].keys.start, end, w)
            else:
                pieces.append(watermark(start, end, w))
        return CommittedOffsets(stable, tuple(ranges), tuple(pieces))

    def with_commit(self, ranges: Sequence[tuple[int, int]], raises: Sequence[Watermark]) -> Model:
        marked = self.marked | {o for s, e in ranges for o in range(s, e + 1)}
        return Model(marked, (*self.raises, *raises))


class CommitMachine(RuleBasedStateMachine):
    # The C merge where it is installed (tests/core/test_commit_native.py runs the Python one).
    merge = staticmethod(apply_individual_commit)

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.state = CommittedOffsets.empty(0)
        self.record_hashes: list[int] = []

    @initialize(record_hashes=st.lists(st.sampled_from(HASHES), min_size=RECORDS, max_size=RECORDS))
    def records(self, record_hashes: list[int]) -> None:
        self.record_hashes = record_hashes

    # Three commit rules against one classic and one reset rule, so that state builds up.
    @rule(
        ranges=st.lists(relative_ranges, max_size=4),
        raises=st.lists(relative_watermarks, max_size=3),
    )
    def individual_commit(
        self, ranges: list[RelativeRange], raises: list[RelativeWatermark]
    ) -> None:
        self.check_individual_commit(ranges, raises)

    @rule(raises=st.lists(relative_watermarks, min_size=1, max_size=2))
    def watermark_commit(self, raises: list[RelativeWatermark]) -> None:
        self.check_individual_commit([], raises)

    @rule(ranges=st.lists(relative_ranges, min_size=1, max_size=2))
    def range_commit(self, ranges: list[RelativeRange]) -> None:
        self.check_individual_commit(ranges, [])

    def check_individual_commit(
        self, relative: list[RelativeRange], relative_raises: list[RelativeWatermark]
    ) -> None:
        before = self.state
        starts = [max(0, before.stable_offset + distance) for distance, _ in relative]
        ranges = [
            (start, start + extra) for start, (_, extra) in zip(starts, relative, strict=True)
        ]
        raises = [
            Watermark(keys, max(0, before.stable_offset + distance))
            for keys, distance in relative_raises
        ]
        result = self.merge(
            before,
            ranges,
            [(w.keys.start, w.keys.end, w.offset) for w in raises],
            max_ic_ranges=MAX_RANGES,
            max_watermark_pieces=MAX_PIECES,
        )

        # The first of: both parts, watermarks only, ranges only, neither; whose applied
        # parts stay within their limit or do not grow the stored count.
        for with_ranges, with_raises in (
            (True, True),
            (False, True),
            (True, False),
            (False, False),
        ):
            candidate = self.model.with_commit(
                ranges if with_ranges else (), raises if with_raises else ()
            )
            expected = candidate.canonical()
            ranges_fit = len(expected.ranges) <= max(MAX_RANGES, len(before.ranges))
            pieces_fit = len(expected.watermarks) <= max(MAX_PIECES, len(before.watermarks))
            if (ranges_fit or not with_ranges) and (pieces_fit or not with_raises):
                break
        if not (with_ranges and with_raises):
            outcome = CommitOutcome.MAX_REACHED
        elif ranges and all(end < before.stable_offset for _, end in ranges):
            outcome = CommitOutcome.TOO_OLD
        else:
            outcome = CommitOutcome.OK

        assert result.outcome is outcome
        assert result.state == expected
        assert result.stable_offset_advanced == (expected.stable_offset > before.stable_offset)
        assert result.duplicate == (
            outcome is CommitOutcome.OK and bool(ranges or raises) and expected == before
        )
        self.model, self.state = candidate, result.state

    @rule(distance=st.integers(-3, 4))
    def classic_commit(self, distance: int) -> None:
        before = self.state
        offset = max(0, before.stable_offset + distance)
        result = apply_classic_commit(before, offset)

        self.model = self.model.with_commit([(0, offset - 1)] if offset else [], [])
        expected = self.model.canonical()
        assert result.state == expected
        assert result.outcome is CommitOutcome.OK
        assert result.stable_offset_advanced == (expected.stable_offset > before.stable_offset)
        assert result.duplicate == (expected == before)
        self.state = result.state

    @rule(to_offset=st.none() | st.integers(0, RECORDS))
    def admin_reset(self, to_offset: int | None) -> None:
        stable = self.state.stable_offset if to_offset is None else to_offset
        self.state = reset_offsets(self.state, to_offset)
        self.model = Model().with_commit([(0, stable - 1)] if stable else [], [])
        assert self.state == self.model.canonical()

    @invariant()
    def every_record_is_processed_exactly_as_the_model_says(self) -> None:
        stable = self.state.stable_offset
        for offset, key_hash in enumerate(self.record_hashes):
            expected = (
                offset in self.model.marked
                or offset < self.model.raised_w(key_hash)
                or offset < stable
            )
            assert self.state.is_processed(offset, key_hash) == expected, (offset, key_hash)
        for key_hash in HASHES:
            assert self.state.watermark_at(key_hash) == max(stable, self.model.raised_w(key_hash))

    @invariant()
    def stored_state_is_canonical(self) -> None:
        stable = self.state.stable_offset
        ranges = self.state.ranges
        assert all(start > stable and start <= end for start, end in ranges)
        assert all(left[1] + 1 < right[0] for left, right in pairwise(ranges))
        pieces = self.state.watermarks
        assert all(piece.offset > stable for piece in pieces)
        for left, right in pairwise(pieces):
            assert left.keys.end < right.keys.start
            assert left.keys.end + 1 < right.keys.start or left.offset != right.offset
        assert ic_offset_count(self.state) == sum(1 for o in self.model.marked if o > stable)
        assert CommittedOffsets.from_json(self.state.to_json()) == self.state


CommitMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_commits_against_the_model = CommitMachine.TestCase


@st.composite
def normalized_pieces(draw: st.DrawFn) -> list[Piece]:
    """Sorted, disjoint pieces over a small hash space, gaps and touching neighbours included."""
    cuts = sorted(draw(st.sets(st.integers(0, 40), max_size=10)))
    pieces = [
        (start, end - 1, draw(st.integers(1, 5)))
        for start, end in pairwise(cuts)
        if draw(st.booleans())
    ]
    return _upper_envelope(pieces) if pieces else []


@settings(max_examples=500)
@given(normalized_pieces(), st.integers(0, 40), st.integers(0, 40), st.integers(1, 6))
def test_one_watermark_raises_stored_pieces_as_the_general_envelope_does(
    pieces: list[Piece], first: int, second: int, offset: int
) -> None:
    lift = (min(first, second), max(first, second), offset)
    assert _raise_one(pieces, lift) == _upper_envelope([*pieces, lift])
