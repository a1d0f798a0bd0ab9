"""What a group has processed in one partition, and the question a consumer asks per record.

This is the read side of docs/design.md §3 and §3a. It lives in the client package so that
workers and Spark executors can skip processed records with no server dependency; the
coordinator's write side (``coordinator/core/offsets.py``) produces these values and relies
on the invariants that ``CommittedOffsets`` enforces on construction.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any, cast

from client.protocol.keyspace import HASH_MAX, HASH_MIN, KeyRange, check_key_range

# Kafka offsets are int64; the stable offset never exceeds this either, because a record at
# offset 2**63-1 could not exist (its next offset would overflow), so capping loses nothing.
OFFSET_MAX = 2**63 - 1


def _checked_int(value: object, what: str, low: int, high: int) -> int:
    # bool is an int subclass; JSON true/false as an offset is a client bug worth rejecting.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{what} must be within [{low}, {high}], got {value}")
    return value


def _checked_list(value: object, what: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{what} must be a list, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class Watermark:
    """Every record with key hash in ``keys`` and offset below ``offset`` is processed."""

    keys: KeyRange
    offset: int

    def __post_init__(self) -> None:
        if not 0 <= self.offset <= OFFSET_MAX:
            raise ValueError(f"watermark offset must be within [0, 2**63-1], got {self.offset}")

    def to_json(self) -> list[int]:
        return [self.keys.start, self.keys.end, self.offset]

    @classmethod
    def from_json(cls, triple: object) -> Watermark:
        items = _checked_list(triple, "a watermark")
        if len(items) != 3:
            raise ValueError(
                f"a watermark is a triple [hash_start, hash_end, offset], got {triple!r}"
            )
        start = _checked_int(items[0], "watermark hash_start", 0, HASH_MAX)
        end = _checked_int(items[1], "watermark hash_end", 0, HASH_MAX)
        if start > end:
            raise ValueError(f"watermark hash range [{start}, {end}] has start > end")
        return cls(KeyRange(start, end), _checked_int(items[2], "watermark offset", 0, OFFSET_MAX))


# A watermark piece as the coordinator's algebra and storage handle it, ``(hash_start,
# hash_end, offset)``: a commit touches a few pieces of every partition it carries, and plain
# tuples cost a fraction of building and comparing ``Watermark`` objects on that path.
Piece = tuple[int, int, int]


@dataclass(frozen=True, init=False)
class CommittedOffsets:
    """A group's committed state for one partition (docs/design.md §3, §3a).

    Invariants, checked on construction so no malformed state reaches the hot path:
    ``ranges`` are sorted, disjoint, non-adjacent closed offset intervals all above
    ``stable_offset``; ``pieces`` (the watermarks, compactly) are sorted, disjoint pieces of
    W(h), adjacent pieces differ in W, and every W is above ``stable_offset`` (W is
    ``stable_offset`` elsewhere).
    """

    stable_offset: int
    ranges: tuple[tuple[int, int], ...]
    pieces: tuple[Piece, ...]
    metadata: str | None

    def __init__(
        self,
        stable_offset: int,
        ranges: Iterable[Sequence[int]] = (),
        watermarks: Iterable[Watermark] = (),
        metadata: str | None = None,
    ) -> None:
        # Accept any sequences but store tuples, so states hash and compare by value.
        self._assign(
            stable_offset,
            cast(tuple[tuple[int, int], ...], tuple(map(tuple, ranges))),
            tuple((w.keys.start, w.keys.end, w.offset) for w in watermarks),
            metadata,
        )

    @classmethod
    def of_pieces(
        cls,
        stable_offset: int,
        ranges: tuple[tuple[int, int], ...],
        pieces: tuple[Piece, ...],
        metadata: str | None = None,
    ) -> CommittedOffsets:
        """The constructor of the coordinator's commit path: tuples in, nothing converted."""
        state = cls.__new__(cls)
        # Through the class: ``state`` has not been initialised, ``_assign`` is what does it.
        cls._assign(state, stable_offset, ranges, pieces, metadata)
        return state

    @classmethod
    def of_canonical_pieces(
        cls,
        stable_offset: int,
        ranges: tuple[tuple[int, int], ...],
        pieces: tuple[Piece, ...],
        metadata: str | None,
    ) -> CommittedOffsets:
        """``of_pieces`` without the invariant checks, for the coordinator's C merge
        (``coordinator/core/_commit.c``), which builds canonical states only: the checks cost
        a third of what is left of a partition's merge, and tests/core/test_commit_native.py
        holds its states equal to the Python merge's, which are checked."""
        state = cls.__new__(cls)
        cls._assign(state, stable_offset, ranges, pieces, metadata, checked=False)
        return state

    def _assign(
        self,
        stable_offset: int,
        ranges: tuple[tuple[int, int], ...],
        pieces: tuple[Piece, ...],
        metadata: str | None,
        checked: bool = True,
    ) -> None:
        # Frozen: the fields are set in the instance's dictionary, which costs half of
        # object.__setattr__ four times; the coordinator builds a few states per partition
        # it commits.
        fields = self.__dict__
        fields["stable_offset"] = stable_offset
        fields["ranges"] = ranges
        fields["pieces"] = pieces
        fields["metadata"] = metadata
        if checked:
            self._check_invariants()

    @cached_property
    def watermarks(self) -> tuple[Watermark, ...]:
        """The pieces as ``Watermark`` values, for code that reads a state rather than merges."""
        return tuple(Watermark(KeyRange(start, end), offset) for start, end, offset in self.pieces)

    # Column copies for bisect, built on first use: consumers ask is_processed once per
    # record, while the coordinator builds many states that are never asked.
    @cached_property
    def _range_starts(self) -> tuple[int, ...]:
        return tuple(map(itemgetter(0), self.ranges))

    @cached_property
    def _range_ends(self) -> tuple[int, ...]:
        return tuple(map(itemgetter(1), self.ranges))

    @cached_property
    def _piece_starts(self) -> tuple[int, ...]:
        return tuple(map(itemgetter(0), self.pieces))

    @cached_property
    def _piece_ends(self) -> tuple[int, ...]:
        return tuple(map(itemgetter(1), self.pieces))

    @cached_property
    def _piece_offsets(self) -> tuple[int, ...]:
        return tuple(map(itemgetter(2), self.pieces))

    def _check_invariants(self) -> None:
        # One chained comparison per range and per piece while all is well (the coordinator
        # checks a few states per partition it commits); the checks that name the broken
        # invariant run only when one is.
        stable = self.stable_offset
        if not 0 <= stable <= OFFSET_MAX:
            raise ValueError(f"stable_offset must be within [0, 2**63-1], got {stable}")
        floor = stable  # the next range must start above this
        for start, end in self.ranges:
            if not floor < start <= end <= OFFSET_MAX:
                self._explain_ranges()
            floor = end + 1
        previous_end = HASH_MIN - 1  # the first piece starts at HASH_MIN or above
        previous_offset = -1
        for start, end, offset in self.pieces:
            if not (
                previous_end < start <= end <= HASH_MAX
                and stable < offset <= OFFSET_MAX
                and (offset != previous_offset or start != previous_end + 1)
            ):
                self._explain_pieces()
            previous_end = end
            previous_offset = offset

    def _explain_ranges(self) -> None:
        """Raise for the first range that breaks an invariant."""
        stable = self.stable_offset
        previous_end: int | None = None
        for start, end in self.ranges:
            if not start <= end <= OFFSET_MAX:
                raise ValueError(f"offset range [{start}, {end}] needs start <= end <= 2**63-1")
            if previous_end is None:
                if start <= stable:
                    raise ValueError(
                        f"offset range [{start}, {end}] must lie above stable_offset {stable}"
                    )
            elif start <= previous_end + 1:
                raise ValueError(
                    f"offset range [{start}, {end}] overlaps or touches the range before it; "
                    "ranges must be sorted, disjoint and non-adjacent"
                )
            previous_end = end

    def _explain_pieces(self) -> None:
        """Raise for the first piece that breaks an invariant."""
        stable = self.stable_offset
        previous_piece: Piece | None = None
        for piece in self.pieces:
            start, end, offset = piece
            if not HASH_MIN <= start <= end <= HASH_MAX:
                check_key_range(start, end, "watermark key range")
            if not stable < offset <= OFFSET_MAX:
                raise ValueError(
                    f"watermark [{start}, {end}] -> {offset} is not above stable_offset {stable}"
                    " (and within 2**63-1)"
                )
            if previous_piece is not None:
                _, previous_end, previous_offset = previous_piece
                if start <= previous_end:
                    raise ValueError(
                        f"watermark pieces {previous_piece} and {piece} are unsorted or overlap"
                    )
                if start == previous_end + 1 and offset == previous_offset:
                    raise ValueError(
                        f"adjacent watermark pieces {previous_piece} and {piece} have the "
                        f"same offset {offset} and must be one piece"
                    )
            previous_piece = piece

    @classmethod
    def empty(cls, start: int) -> CommittedOffsets:
        return cls(stable_offset=start)

    def is_processed(self, offset: int, key_hash: int) -> bool:
        """Whether a consumer may skip this record: it is on the hot path, once per record."""
        if offset < self.stable_offset:
            return True
        index = bisect_right(self._range_starts, offset) - 1
        if index >= 0 and offset <= self._range_ends[index]:
            return True
        index = bisect_right(self._piece_starts, key_hash) - 1
        return (
            index >= 0
            and key_hash <= self._piece_ends[index]
            and offset < self._piece_offsets[index]
        )

    def watermark_at(self, key_hash: int) -> int:
        """W(h): every record with this key hash below the returned offset is processed."""
        index = bisect_right(self._piece_starts, key_hash) - 1
        if index >= 0 and key_hash <= self._piece_ends[index]:
            return self._piece_offsets[index]
        return self.stable_offset

    def min_watermark(self, keys: KeyRange) -> int:
        """Lowest W over ``keys``: where a slice owner may resume without reprocessing."""
        index = bisect_right(self._piece_starts, keys.start) - 1
        if index < 0 or self._piece_ends[index] < keys.start:
            return self.stable_offset
        lowest = self._piece_offsets[index]
        reach = self._piece_ends[index]
        while reach < keys.end:
            index += 1
            if index == len(self._piece_starts) or self._piece_starts[index] != reach + 1:
                return self.stable_offset
            lowest = min(lowest, self._piece_offsets[index])
            reach = self._piece_ends[index]
        return lowest

    def to_json(self) -> dict[str, Any]:
        return {
            "stable_offset": self.stable_offset,
            "ranges": [[start, end] for start, end in self.ranges],
            "watermarks": [list(piece) for piece in self.pieces],
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> CommittedOffsets:
        """Parse the offset-fetch shape of docs/api.md, ignoring topic, partition and extras."""
        if not isinstance(document, Mapping):
            raise ValueError(f"committed offsets must be an object, got {type(document).__name__}")
        if "stable_offset" not in document:
            raise ValueError("committed offsets need a stable_offset")
        stable = _checked_int(document["stable_offset"], "stable_offset", 0, OFFSET_MAX)
        metadata = document.get("metadata")
        if metadata is not None and not isinstance(metadata, str):
            raise ValueError(f"metadata must be a string or null, got {type(metadata).__name__}")
        return cls(
            stable_offset=stable,
            ranges=tuple(_parse_ranges(_checked_list(document.get("ranges", []), "ranges"))),
            watermarks=tuple(
                Watermark.from_json(triple)
                for triple in _checked_list(document.get("watermarks", []), "watermarks")
            ),
            metadata=metadata,
        )


def _parse_ranges(pairs: Iterable[object]) -> Iterable[tuple[int, int]]:
    for pair in pairs:
        items = _checked_list(pair, "an offset range")
        if len(items) != 2:
            raise ValueError(f"an offset range is a pair [start, end], got {pair!r}")
        start = _checked_int(items[0], "offset range start", 0, OFFSET_MAX)
        end = _checked_int(items[1], "offset range end", 0, OFFSET_MAX)
        if start > end:
            raise ValueError(f"offset range [{start}, {end}] has start > end")
        yield start, end
