"""The read side: what a consumer skips, checked on docs/design.md's examples and against a
naive model."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.protocol.committed import OFFSET_MAX, CommittedOffsets, Watermark
from client.protocol.keyspace import HASH_MAX, KeyRange

HALF = 2**62  # first hash of the upper half of the hash space


def watermark(start: int, end: int, offset: int) -> Watermark:
    return Watermark(KeyRange(start, end), offset)


def test_gap_amending_commits_only_what_the_fetch_processed() -> None:
    # docs/design.md §3: LSO 40, IC [43-45],[48-49], fetched [40..50]; offset 40 is another slice's.
    mine, theirs = KeyRange(0, HALF - 1), KeyRange(HALF, HASH_MAX)
    record_hashes = {offset: 7 for offset in range(40, 51)} | {40: HALF + 7}
    committed = CommittedOffsets(40, ((43, 45), (48, 49)))

    to_process = [
        offset
        for offset, key_hash in record_hashes.items()
        if mine.contains(key_hash) and not committed.is_processed(offset, key_hash)
    ]

    assert to_process == [41, 42, 46, 47, 50]
    assert theirs.contains(record_hashes[40]) and not committed.is_processed(40, HALF + 7)


def test_is_processed_below_stable_offset_in_ranges_and_under_watermarks() -> None:
    committed = CommittedOffsets(
        10, ((15, 17),), (watermark(0, 99, 20), watermark(200, HASH_MAX, 12))
    )

    assert committed.is_processed(9, 150) and not committed.is_processed(10, 150)
    assert committed.is_processed(15, 150) and committed.is_processed(17, 150)
    assert not committed.is_processed(18, 150)
    assert committed.is_processed(19, 99) and not committed.is_processed(20, 99)
    assert not committed.is_processed(19, 100)
    assert committed.is_processed(11, HASH_MAX) and not committed.is_processed(12, HASH_MAX)


def test_watermark_at_falls_back_to_the_stable_offset_between_pieces() -> None:
    committed = CommittedOffsets(5, (), (watermark(10, 20, 30), watermark(21, 40, 8)))

    assert [committed.watermark_at(h) for h in (9, 10, 20, 21, 40, 41)] == [5, 30, 30, 8, 8, 5]


def test_min_watermark_needs_the_whole_key_range_covered() -> None:
    committed = CommittedOffsets(
        5, (), (watermark(10, 20, 30), watermark(21, 40, 8), watermark(50, 60, 9))
    )

    assert committed.min_watermark(KeyRange(12, 15)) == 30
    assert committed.min_watermark(KeyRange(10, 40)) == 8
    assert committed.min_watermark(KeyRange(10, 41)) == 5
    assert committed.min_watermark(KeyRange(9, 20)) == 5
    assert committed.min_watermark(KeyRange(35, 55)) == 5
    assert committed.min_watermark(KeyRange(55, 60)) == 9
    assert CommittedOffsets.empty(3).min_watermark(KeyRange.full()) == 3


def test_json_round_trip_uses_the_offset_fetch_shape() -> None:
    document = {
        "topic": "orders",
        "partition": 0,
        "stable_offset": 40,
        "ranges": [[43, 45], [48, 49]],
        "watermarks": [[0, 99, 44]],
        "metadata": None,
    }

    committed = CommittedOffsets.from_json(document)

    assert committed == CommittedOffsets(40, ((43, 45), (48, 49)), (watermark(0, 99, 44),))
    assert committed.to_json() == {
        k: v for k, v in document.items() if k not in ("topic", "partition")
    }


def test_from_json_defaults_missing_ranges_and_watermarks_to_empty() -> None:
    assert CommittedOffsets.from_json({"stable_offset": 7}) == CommittedOffsets.empty(7)


def test_empty_starts_with_nothing_processed_at_or_after_start() -> None:
    committed = CommittedOffsets.empty(12)

    assert committed.is_processed(11, 0) and not committed.is_processed(12, 0)
    assert committed.to_json() == {
        "stable_offset": 12,
        "ranges": [],
        "watermarks": [],
        "metadata": None,
    }


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "must be an object"),
        ({}, "need a stable_offset"),
        ({"stable_offset": -1}, "stable_offset must be within"),
        ({"stable_offset": 2**63}, "stable_offset must be within"),
        ({"stable_offset": True}, "stable_offset must be an integer"),
        ({"stable_offset": 1.5}, "stable_offset must be an integer"),
        ({"stable_offset": 0, "ranges": {"a": 1}}, "ranges must be a list"),
        ({"stable_offset": 0, "ranges": [[1, 2, 3]]}, "is a pair"),
        ({"stable_offset": 0, "ranges": [[5, 4]]}, "start > end"),
        ({"stable_offset": 0, "ranges": [[5, 2**63]]}, "offset range end must be within"),
        ({"stable_offset": 5, "ranges": [[5, 6]]}, "above stable_offset 5"),
        ({"stable_offset": 0, "ranges": [[5, 6], [1, 2]]}, "sorted, disjoint and non-adjacent"),
        ({"stable_offset": 0, "ranges": [[1, 2], [3, 4]]}, "sorted, disjoint and non-adjacent"),
        ({"stable_offset": 0, "ranges": [[1, 4], [3, 6]]}, "sorted, disjoint and non-adjacent"),
        ({"stable_offset": 0, "watermarks": [[0, 9]]}, "is a triple"),
        ({"stable_offset": 0, "watermarks": [[9, 0, 5]]}, "start > end"),
        ({"stable_offset": 0, "watermarks": [[0, 2**63, 5]]}, "hash_end must be within"),
        ({"stable_offset": 0, "watermarks": [[0, 9, -5]]}, "offset must be within"),
        ({"stable_offset": 5, "watermarks": [[0, 9, 5]]}, "not above stable_offset 5"),
        ({"stable_offset": 0, "watermarks": [[0, 9, 5], [5, 19, 6]]}, "unsorted or overlap"),
        ({"stable_offset": 0, "watermarks": [[10, 19, 5], [0, 9, 6]]}, "unsorted or overlap"),
        ({"stable_offset": 0, "watermarks": [[0, 9, 5], [10, 19, 5]]}, "must be one piece"),
        ({"stable_offset": 0, "metadata": 5}, "metadata must be a string"),
    ],
)
def test_from_json_rejects_malformed_state_with_a_clear_message(
    document: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        CommittedOffsets.from_json(document)


@pytest.mark.parametrize(
    ("pieces", "message"),
    [
        (((9, 0, 5),), "not within"),
        (((0, HASH_MAX + 1, 5),), "not within"),
        (((0, 9, 3),), "not above stable_offset 3"),
        (((0, 9, OFFSET_MAX + 1),), "not above stable_offset"),
        (((0, 9, 5), (9, 19, 6)), "unsorted or overlap"),
        (((0, 9, 5), (10, 19, 5)), "must be one piece"),
    ],
)
def test_the_compact_constructor_checks_the_same_invariants(
    pieces: tuple[tuple[int, int, int], ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        CommittedOffsets.of_pieces(3, (), pieces)


def test_compact_and_watermark_forms_of_a_state_are_one_value() -> None:
    pieces = ((0, 9, 20), (10, HASH_MAX, 12))
    compact = CommittedOffsets.of_pieces(10, ((15, 17),), pieces, "m")

    assert compact == CommittedOffsets(
        10, [[15, 17]], (watermark(0, 9, 20), watermark(10, HASH_MAX, 12)), "m"
    )
    assert compact.watermarks == (watermark(0, 9, 20), watermark(10, HASH_MAX, 12))
    assert compact.is_processed(19, 5) and not compact.is_processed(19, 11)


def test_watermark_rejects_offsets_outside_int64() -> None:
    with pytest.raises(ValueError, match="watermark offset"):
        watermark(0, 1, -1)
    with pytest.raises(ValueError, match="watermark offset"):
        watermark(0, 1, OFFSET_MAX + 1)


def test_state_at_the_int64_limits_is_valid() -> None:
    committed = CommittedOffsets(
        OFFSET_MAX - 2, ((OFFSET_MAX, OFFSET_MAX),), (watermark(HASH_MAX, HASH_MAX, OFFSET_MAX),)
    )

    assert committed.is_processed(OFFSET_MAX, 0)
    assert not committed.is_processed(OFFSET_MAX - 1, 0)
    assert committed.is_processed(OFFSET_MAX - 1, HASH_MAX)
    assert CommittedOffsets.from_json(committed.to_json()) == committed


# A naive model of a state: the hash space cut into segments, each with W or none (stable).
HASH_POINTS = sorted({0, 1, 2, HALF - 1, HALF, HALF + 1, HASH_MAX - 1, HASH_MAX, 999, 1000})


@st.composite
def states_with_segments(
    draw: st.DrawFn,
) -> tuple[CommittedOffsets, list[tuple[int, int, int | None]]]:
    stable = draw(st.integers(0, 30))
    marked = sorted(draw(st.sets(st.integers(stable + 1, stable + 40))))
    ranges: list[tuple[int, int]] = []
    for offset in marked:
        if ranges and ranges[-1][1] + 1 == offset:
            ranges[-1] = (ranges[-1][0], offset)
        else:
            ranges.append((offset, offset))
    cuts = sorted(draw(st.sets(st.sampled_from(HASH_POINTS[1:]), max_size=6)))
    starts = [0, *cuts]
    ends = [cut - 1 for cut in cuts] + [HASH_MAX]
    segments = [
        (start, end, draw(st.none() | st.integers(stable + 1, stable + 50)))
        for start, end in zip(starts, ends, strict=True)
    ]
    pieces: list[Watermark] = []
    for start, end, level in segments:
        if level is None:
            continue
        if pieces and pieces[-1].keys.end + 1 == start and pieces[-1].offset == level:
            pieces[-1] = watermark(pieces[-1].keys.start, end, level)
        else:
            pieces.append(watermark(start, end, level))
    return CommittedOffsets(stable, tuple(ranges), tuple(pieces)), segments


@given(states_with_segments(), st.sampled_from(HASH_POINTS), st.sampled_from(HASH_POINTS))
def test_queries_agree_with_a_naive_model(
    state_and_segments: tuple[CommittedOffsets, list[tuple[int, int, int | None]]],
    first_hash: int,
    second_hash: int,
) -> None:
    committed, segments = state_and_segments
    stable = committed.stable_offset

    def naive_w(key_hash: int) -> int:
        return next(
            stable if w is None else w for start, end, w in segments if start <= key_hash <= end
        )

    in_ranges = {o for start, end in committed.ranges for o in range(start, end + 1)}
    for key_hash in HASH_POINTS:
        assert committed.watermark_at(key_hash) == naive_w(key_hash)
        for offset in range(max(0, stable - 2), stable + 60):
            expected = offset < stable or offset in in_ranges or offset < naive_w(key_hash)
            assert committed.is_processed(offset, key_hash) == expected
    keys = KeyRange(min(first_hash, second_hash), max(first_hash, second_hash))
    assert committed.min_watermark(keys) == min(
        stable if w is None else w
        for start, end, w in segments
        if start <= keys.end and keys.start <= end
    )
    assert CommittedOffsets.from_json(committed.to_json()) == committed


def test_state_pickles_for_spark_executors_and_keeps_answering() -> None:
    committed = CommittedOffsets(5, ((7, 8),), (watermark(0, 9, 20),), metadata="m")

    copy = pickle.loads(pickle.dumps(committed))

    assert copy == committed and hash(copy) == hash(committed)
    assert copy.is_processed(19, 9) and not copy.is_processed(19, 10)
