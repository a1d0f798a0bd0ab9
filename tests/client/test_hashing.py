"""docs/design.md §2: the key hash every client must share, and how key ranges split."""

from __future__ import annotations

from itertools import pairwise

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from client import KeyRange, key_hash
from client.protocol.keyspace import (
    HASH_MAX,
    HASH_MIN,
    digest_bounds,
    digest_in_ranges,
    in_ranges,
    key_digest,
    key_digest_bytes,
)


@pytest.mark.parametrize(
    ("key", "expected"),
    [(b"", 0), (b"a", 4803839638238968900), (b"user-42", 2781376373611560273)],
)
def test_design_vectors(key: bytes, expected: int) -> None:
    assert key_hash(key, offset=123) == expected


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_a_null_key_hashes_its_offset_as_eight_big_endian_bytes(offset: int) -> None:
    assert key_hash(None, offset) == key_hash(offset.to_bytes(8, "big"), offset)


def test_null_keys_spread_over_the_hash_space() -> None:
    lower, _ = KeyRange.full().split(2)
    in_lower = sum(lower.contains(key_hash(None, offset)) for offset in range(1000))
    assert 400 < in_lower < 600


@given(st.binary(max_size=64))
def test_hashes_are_63_bit_and_match_the_java_definition(key: bytes) -> None:
    hashed = key_hash(key, 0)
    assert 0 <= hashed <= HASH_MAX
    # Java: Hashing.murmur3_128().hashBytes(k).asLong() >>> 1 (low 8 bytes, little-endian).
    low_64 = int.from_bytes(mmh3.hash_bytes(key, 0)[:8], "little")
    assert hashed == low_64 >> 1


@given(
    st.integers(min_value=0, max_value=HASH_MAX),
    st.integers(min_value=0, max_value=HASH_MAX),
    st.integers(min_value=1, max_value=64),
)
def test_split_parts_are_contiguous_balanced_and_stable(a: int, b: int, parts: int) -> None:
    whole = KeyRange(min(a, b), max(a, b))
    if parts > whole.size:
        with pytest.raises(ValueError):
            whole.split(parts)
        return
    pieces = whole.split(parts)
    assert len(pieces) == parts
    assert pieces[0].start == whole.start and pieces[-1].end == whole.end
    assert all(left.end + 1 == right.start for left, right in pairwise(pieces))
    sizes = [piece.size for piece in pieces]
    assert max(sizes) - min(sizes) <= 1
    assert whole.split(parts) == pieces


@given(
    key=st.binary(max_size=64),
    bounds=st.tuples(
        st.integers(min_value=HASH_MIN, max_value=HASH_MAX),
        st.integers(min_value=HASH_MIN, max_value=HASH_MAX),
    ).map(sorted),
)
def test_digest_bounds_judge_a_key_as_its_hash_would(key: bytes, bounds: list[int]) -> None:
    start, end = bounds
    low, high = digest_bounds(start, end)
    assert (low <= key_digest(key, 0)[0] <= high) == (start <= key_hash(key, 0) <= end)


@given(key=st.binary(max_size=64))
def test_digest_bounds_hold_at_the_edges_of_a_range(key: bytes) -> None:
    hashed = key_hash(key, 0)
    half = key_digest(key, 0)[0]
    low, high = digest_bounds(hashed, hashed)
    assert low <= half <= high
    if hashed > HASH_MIN:
        assert not half <= digest_bounds(HASH_MIN, hashed - 1)[1]
    if hashed < HASH_MAX:
        assert not digest_bounds(hashed + 1, HASH_MAX)[0] <= half


@given(
    hashed=st.integers(min_value=HASH_MIN, max_value=HASH_MAX),
    ends=st.lists(
        st.tuples(
            st.integers(min_value=HASH_MIN, max_value=HASH_MAX),
            st.integers(min_value=HASH_MIN, max_value=HASH_MAX),
        ).map(sorted),
        max_size=4,
    ),
)
def test_ranges_contain_a_hash_or_a_digest_when_one_of_them_does(
    hashed: int, ends: list[list[int]]
) -> None:
    ranges = [KeyRange(start, end) for start, end in ends]
    assert in_ranges(ranges, hashed) == any(keys.contains(hashed) for keys in ranges)
    digest = key_digest_bytes(hashed.to_bytes(8, "big"), 0)
    hashed_key = key_hash(hashed.to_bytes(8, "big"), 0)
    assert digest_in_ranges(ranges, digest) == any(keys.contains(hashed_key) for keys in ranges)
    # A range holding exactly the key's hash, and ranges stopping one short of it.
    assert digest_in_ranges([KeyRange(hashed_key, hashed_key)], digest)
    if hashed_key > HASH_MIN:
        assert not digest_in_ranges([KeyRange(HASH_MIN, hashed_key - 1)], digest)
    for keys in ranges:
        assert in_ranges(ranges, keys.start) and in_ranges(ranges, keys.end)
