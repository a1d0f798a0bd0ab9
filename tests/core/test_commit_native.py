"""The C merge of an individual commit (``coordinator.core._commit``) against the Python one,
which stays the reference: the model test run on the Python path too, and both paths on the
same random states and commits."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.protocol.committed import OFFSET_MAX, CommittedOffsets, Piece
from client.protocol.keyspace import HASH_MAX
from coordinator.core import _commit, offsets
from coordinator.core.offsets import (
    _upper_envelope,
    apply_individual_commit,
    merge_in_python,
)
from tests.core.test_offsets import CommitMachine


class PythonCommitMachine(CommitMachine):
    """The model test of tests/core/test_offsets.py with the C module left out."""

    merge = staticmethod(merge_in_python)


PythonCommitMachine.TestCase.settings = CommitMachine.TestCase.settings
test_the_python_path_against_the_model = PythonCommitMachine.TestCase

# Hash bounds where the edge cases are: the ends of the space, and a few cuts with their
# neighbours, so that pieces touch, overlap, nest and cover the whole space.
_HASHES = sorted({0, 1, 2**61, 2**62 - 1, 2**62, 2**62 + 1, HASH_MAX - 1, HASH_MAX})


@st.composite
def stored_states(draw: st.DrawFn) -> CommittedOffsets:
    stable = draw(st.sampled_from([0, 5, 100, OFFSET_MAX - 10]))
    points = sorted(draw(st.sets(st.integers(1, 30), max_size=8)))
    ranges: list[tuple[int, int]] = []
    for start, end in zip(points[::2], points[1::2], strict=False):
        # Stored ranges lie above the stable offset, apart: adjacent ones would be one range.
        if stable + end <= OFFSET_MAX and (not ranges or stable + start > ranges[-1][1] + 1):
            ranges.append((stable + start, stable + end))
    cuts = sorted(draw(st.sets(st.sampled_from(_HASHES), max_size=6)) | {0})
    ends = [cut - 1 for cut in cuts[1:]] + [HASH_MAX]
    pieces: list[Piece] = [
        (start, end, stable + draw(st.integers(1, 4)))
        for start, end in zip(cuts, ends, strict=True)
        if draw(st.booleans()) and stable + 4 <= OFFSET_MAX
    ]
    return CommittedOffsets.of_pieces(
        stable, tuple(ranges), tuple(_upper_envelope(pieces)) if pieces else ()
    )


def _relative_ranges(stable: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.lists(
        st.tuples(st.integers(-6, 30), st.integers(0, 4)).map(
            lambda pair: (
                min(OFFSET_MAX, max(0, stable + pair[0])),
                min(OFFSET_MAX, max(0, stable + pair[0]) + pair[1]),
            )
        ),
        max_size=5,
    )


def _watermarks(stable: int) -> st.SearchStrategy[list[Piece]]:
    return st.lists(
        st.tuples(st.sampled_from(_HASHES), st.sampled_from(_HASHES), st.integers(-3, 6)).map(
            lambda t: (
                min(t[0], t[1]),
                max(t[0], t[1]),
                min(OFFSET_MAX, max(0, stable + t[2])),
            )
        ),
        max_size=4,
    )


@st.composite
def commits(draw: st.DrawFn) -> tuple[CommittedOffsets, list[tuple[int, int]], list[Piece], int]:
    state = draw(stored_states())
    return (
        state,
        draw(_relative_ranges(state.stable_offset)),
        draw(_watermarks(state.stable_offset)),
        draw(st.sampled_from([1, 2, 3, 1_000])),
    )


@settings(max_examples=2_000, deadline=None)
@given(commits())
def test_the_c_merge_decides_every_small_commit_as_the_python_path_does(
    case: tuple[CommittedOffsets, list[tuple[int, int]], list[Piece], int],
) -> None:
    state, ranges, watermarks, limit = case
    python = merge_in_python(
        state, ranges, watermarks, max_ic_ranges=limit, max_watermark_pieces=limit
    )
    merged = _commit.apply(
        state.stable_offset, state.ranges, state.pieces, ranges, watermarks, limit, limit
    )
    if merged is None:
        # Declined only where the result is over a limit: refused in part, or let through
        # because it does not grow what was stored past it.
        assert python.outcome is offsets.MAX_REACHED or (
            len(python.state.ranges) > limit or len(python.state.pieces) > limit
        )
        return
    stable, kept_ranges, kept_pieces, too_old, advanced, duplicate = merged
    assert (stable, kept_ranges, kept_pieces) == (
        python.state.stable_offset,
        python.state.ranges,
        python.state.pieces,
    )
    assert (too_old, advanced, duplicate) == (
        python.outcome is offsets.TOO_OLD,
        python.stable_offset_advanced,
        python.duplicate,
    )
    assert (
        apply_individual_commit(
            state, ranges, watermarks, max_ic_ranges=limit, max_watermark_pieces=limit
        )
        == python
    )


def test_a_state_larger_than_the_c_merge_takes_is_merged_in_python() -> None:
    stable = 10
    ranges = tuple((stable + 2 * i + 1, stable + 2 * i + 1) for i in range(100))
    state = CommittedOffsets.of_pieces(stable, ranges, ())
    assert _commit.apply(stable, ranges, (), [(stable, stable)], [], 1_000, 1_000) is None
    result = apply_individual_commit(
        state, [(stable, stable)], [], max_ic_ranges=1_000, max_watermark_pieces=1_000
    )
    assert result.state.stable_offset == stable + 2 and len(result.state.ranges) == 99


@pytest.mark.parametrize(
    ("ranges", "watermarks"),
    [
        ([(5, 3)], []),  # start after end
        ([(-1, 3)], []),
        ([], [(9, 3, 20)]),
        ([], [(0, 3, -1)]),
        ([(0, 2**63)], []),  # past int64
        ([(True, 3)], []),  # a bool is not an offset
        ([[1, 3]], []),  # not a tuple
    ],
)
def test_what_the_c_merge_does_not_read_it_leaves_to_the_python_path(
    ranges: list[tuple[int, int]], watermarks: list[Piece]
) -> None:
    assert _commit.apply(0, (), (), ranges, watermarks, 10, 10) is None


def test_a_full_space_watermark_at_the_largest_offset_settles_there_in_c() -> None:
    merged = _commit.apply(0, (), (), [], [(0, HASH_MAX, OFFSET_MAX)], 10, 10)
    assert merged == (OFFSET_MAX, (), (), False, True, False)
    merged = _commit.apply(0, (), (), [(3, OFFSET_MAX - 1)], [], 10, 10)
    assert merged == (0, ((3, OFFSET_MAX - 1),), (), False, False, False)


def test_nested_watermarks_split_the_piece_that_holds_them_in_c() -> None:
    stored = ((0, 99, 5),)
    merged = _commit.apply(0, (), stored, [], [(10, 19, 9), (30, 39, 9), (50, 59, 9)], 10, 10)
    assert merged is not None
    assert merged[2] == (
        (0, 9, 5),
        (10, 19, 9),
        (20, 29, 5),
        (30, 39, 9),
        (40, 49, 5),
        (50, 59, 9),
        (60, 99, 5),
    )
    assert all(left[1] + 1 == right[0] for left, right in pairwise(merged[2]))
