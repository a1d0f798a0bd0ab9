"""How commits change a partition's committed state (docs/design.md §3, §3a).

Pure functions over ``CommittedOffsets`` so the storage layer can run them inside its
transaction, one partition at a time, and tests can check them against a naive model. Commits
carry up to 60,000 ranges and a partition may hold ~10,000, so every step works on sorted
sequences with bisect and touches only the stretch a commit overlaps.

Decisions docs/design.md and docs/api.md leave open:
- The stable offset is capped at 2**63-1: no Kafka record can sit at that offset (its next
  offset would overflow int64), and storage keeps offsets in int8.
- A limit (``max_ic_ranges``, ``max_watermark_pieces``) refuses only a commit that would leave
  the stored count above the limit *and* above what was stored before, so a commit that fills
  gaps is always accepted, even after the limit was lowered below what is stored.
- ``MAX_REACHED`` wins over ``TOO_OLD``: the client must learn that part of its commit was not
  applied.
"""

from __future__ import annotations

import enum
import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from operator import itemgetter

from client.protocol import error_names as names
from client.protocol.committed import OFFSET_MAX, CommittedOffsets, Piece
from client.protocol.keyspace import HASH_MAX, HASH_MIN, check_key_range

try:
    from coordinator.core import _commit as native
except ImportError:  # installed without a C compiler: every commit is merged in Python
    native = None  # type: ignore[assignment]

OffsetRange = tuple[int, int]


class CommitOutcome(enum.Enum):
    OK = "OK"
    TOO_OLD = names.INDIVIDUAL_COMMIT_TOO_OLD
    MAX_REACHED = names.MAX_INDIVIDUAL_COMMIT_REACHED

    @property
    def error_name(self) -> str | None:
        """The reply's per-partition ``error`` field (docs/api.md)."""
        return None if self is CommitOutcome.OK else self.value


# The members as module constants: reading one through its class costs ten times as much, and
# a commit reads a few per partition.
OK, TOO_OLD, MAX_REACHED = CommitOutcome.OK, CommitOutcome.TOO_OLD, CommitOutcome.MAX_REACHED


@dataclass(slots=True)
class PartitionCommitResult:
    state: CommittedOffsets
    outcome: CommitOutcome
    stable_offset_advanced: bool
    # The commit carried something and changed nothing: at-least-once redelivery, logged at
    # debug by the caller rather than reported to the client (docs/design.md §3.3).
    duplicate: bool


def apply_individual_commit(
    state: CommittedOffsets,
    ranges: Sequence[OffsetRange],
    watermarks: Sequence[Piece],
    *,
    max_ic_ranges: int,
    max_watermark_pieces: int,
) -> PartitionCommitResult:
    """Merge one partition entry of a commit into ``state``.

    Ranges wholly below the stable offset are ignored (``TOO_OLD`` when that is all of them),
    ranges straddling it are clipped; watermarks at or below it are no-ops. Ranges and
    watermarks are refused separately when they would grow the stored state past its limit.

    The common case (a small state, nothing near a limit) is merged by the C module
    ``coordinator.core._commit`` where it is installed; it leaves everything else to
    ``merge_in_python``, which decides the same.
    """
    if native is not None:
        merged = native.apply(
            state.stable_offset,
            state.ranges,
            state.pieces,
            ranges,
            watermarks,
            max_ic_ranges,
            max_watermark_pieces,
        )
        if merged is not None:
            stable, kept_ranges, kept_pieces, too_old, advanced, duplicate = merged
            return PartitionCommitResult(
                CommittedOffsets.of_canonical_pieces(
                    stable, kept_ranges, kept_pieces, state.metadata
                ),
                TOO_OLD if too_old else OK,
                advanced,
                duplicate,
            )
    return merge_in_python(
        state,
        ranges,
        watermarks,
        max_ic_ranges=max_ic_ranges,
        max_watermark_pieces=max_watermark_pieces,
    )


def merge_in_python(
    state: CommittedOffsets,
    ranges: Sequence[OffsetRange],
    watermarks: Sequence[Piece],
    *,
    max_ic_ranges: int,
    max_watermark_pieces: int,
) -> PartitionCommitResult:
    """``apply_individual_commit`` in Python: every case, and the reference the C module is
    tested against."""
    stable = state.stable_offset
    stored_ranges = state.ranges
    stored_pieces = state.pieces
    fresh = _clipped_ranges(ranges, floor=stable) if ranges else ()
    merged_ranges = _merge_ranges(stored_ranges, fresh) if fresh else stored_ranges
    raised_pieces = (
        _raise_watermarks(stored_pieces, watermarks, floor=stable) if watermarks else stored_pieces
    )
    candidate = _settle(stable, merged_ranges, raised_pieces, state.metadata)
    # The common case settles once: nothing near a limit, so nothing to refuse.
    if len(candidate.ranges) > max_ic_ranges or len(candidate.pieces) > max_watermark_pieces:
        candidate, outcome = _within_limits(
            state, merged_ranges, raised_pieces, max_ic_ranges, max_watermark_pieces
        )
    else:
        outcome = OK
    if outcome is OK and ranges and not fresh:
        outcome = TOO_OLD
    advanced = candidate.stable_offset > stable
    return PartitionCommitResult(
        candidate,
        outcome,
        advanced,
        # The metadata is the stored one: the other fields say whether anything changed.
        outcome is OK
        and bool(ranges or watermarks)
        and not advanced
        and candidate.ranges == stored_ranges
        and candidate.pieces == stored_pieces,
    )


def _within_limits(
    state: CommittedOffsets,
    merged_ranges: Sequence[OffsetRange],
    raised_pieces: Sequence[Piece],
    max_ic_ranges: int,
    max_watermark_pieces: int,
) -> tuple[CommittedOffsets, CommitOutcome]:
    """The settled state with the ranges, the watermarks, or both refused where they would
    grow the stored state past its limit; ``MAX_REACHED`` when any part was refused."""
    apply_ranges, apply_watermarks = True, True
    while True:
        candidate = _settle(
            state.stable_offset,
            merged_ranges if apply_ranges else state.ranges,
            raised_pieces if apply_watermarks else state.pieces,
            state.metadata,
        )
        ranges_refused = apply_ranges and _exceeds(
            len(candidate.ranges), len(state.ranges), max_ic_ranges
        )
        pieces_refused = apply_watermarks and _exceeds(
            len(candidate.pieces), len(state.pieces), max_watermark_pieces
        )
        if not (ranges_refused or pieces_refused):
            break
        # Refusing one part can only lower the stable offset and so grow the other part's
        # count; the loop ends within three rounds because a refused part never comes back.
        apply_ranges = apply_ranges and not ranges_refused
        apply_watermarks = apply_watermarks and not pieces_refused
    if apply_ranges and apply_watermarks:
        return candidate, OK
    return candidate, MAX_REACHED


def apply_classic_commit(state: CommittedOffsets, offset: int) -> PartitionCommitResult:
    """A plain offset commit: the stable offset moves forward only (an admin reset may go back)."""
    _check_offset(offset, "committed offset")
    stable = state.stable_offset
    if offset > stable:
        # ``_settle`` keeps every piece when the stable offset does not move past this one.
        pieces = tuple(piece for piece in state.pieces if piece[2] > offset)
        settled = _settle(offset, state.ranges, pieces, state.metadata)
    else:
        settled = _settle(stable, state.ranges, state.pieces, state.metadata)
    return PartitionCommitResult(
        state=settled,
        outcome=OK,
        stable_offset_advanced=settled.stable_offset > state.stable_offset,
        duplicate=settled == state,
    )


def reset_offsets(state: CommittedOffsets, to_offset: int | None) -> CommittedOffsets:
    """Admin reset: drop ranges and watermarks, and move the stable offset when given.

    Moving it clears the metadata too, as Kafka's offset reset does: it described the old
    position.
    """
    if to_offset is None:
        return CommittedOffsets(stable_offset=state.stable_offset, metadata=state.metadata)
    _check_offset(to_offset, "reset offset")
    return CommittedOffsets(stable_offset=to_offset)


def ic_offset_count(state: CommittedOffsets) -> int:
    """Offsets held in IC ranges: processed above the stable offset, for lag reporting."""
    return sum(end - start + 1 for start, end in state.ranges)


def _check_offset(value: int, what: str) -> None:
    if not 0 <= value <= OFFSET_MAX:
        raise ValueError(f"{what} must be within [0, 2**63-1], got {value}")


def _clipped_ranges(ranges: Sequence[OffsetRange], *, floor: int) -> list[OffsetRange]:
    """The ranges' parts at or above ``floor``, in input order.

    Validates each range although the HTTP layer already did: defence in depth for any caller.
    """
    clipped = []
    for start, end in ranges:
        if not 0 <= start <= end <= OFFSET_MAX:
            raise ValueError(f"offset range [{start}, {end}] needs 0 <= start <= end <= 2**63-1")
        if end >= floor:
            clipped.append((start if start >= floor else floor, end))
    return clipped


def _exceeds(count: int, stored_count: int, limit: int) -> bool:
    return count > limit and count > stored_count


# Bisect and sort keys of offset ranges and of watermark pieces alike, which both begin with
# (start, end); itemgetter runs in C, where a commit's bisects spend most of their time.
_start = itemgetter(0)
_end = itemgetter(1)
# Up to this many stored ranges or pieces, a commit re-merges all of them: finding the stretch
# it touches by bisection costs more than the merge it saves. Partitions that members commit
# often hold a few.
_SHORT = 8


def _coalesce(sorted_ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
    """Merge overlapping and adjacent ranges of a non-empty sorted sequence."""
    merged: list[OffsetRange] = []
    run_start, run_end = sorted_ranges[0]
    for start, end in sorted_ranges:
        if start <= run_end + 1:
            if end > run_end:
                run_end = end
        else:
            merged.append((run_start, run_end))
            run_start, run_end = start, end
    merged.append((run_start, run_end))
    return merged


def _merge_ranges(
    stored: Sequence[OffsetRange], fresh: Sequence[OffsetRange]
) -> Sequence[OffsetRange]:
    """Union of normalized ``stored`` and non-empty unsorted ``fresh``.

    Only the stored stretch that ``fresh`` spans (with its touching neighbours) is re-merged.
    """
    if len(stored) <= _SHORT:
        return _coalesce(sorted([*stored, *fresh]))
    span_start: int = min(fresh)[0]
    span_end: int = max(map(_end, fresh))
    low = bisect_left(stored, span_start - 1, key=_end)
    high = bisect_right(stored, span_end + 1, key=_start)
    middle = [*stored[low:high], *fresh]
    middle.sort(key=_start)  # Timsort takes the stored stretch as one presorted run
    return [*stored[:low], *_coalesce(middle), *stored[high:]]


def _raise_watermarks(
    stored: Sequence[Piece], raises: Sequence[Piece], *, floor: int
) -> Sequence[Piece]:
    """W(h) := max(W(h), raise) under each raise; raises at or below ``floor`` change nothing.

    Validates each raise although the HTTP layer already did: defence in depth for any caller.
    """
    for start, end, offset in raises:
        # The checks' own calls only when a value is out of range, for their messages.
        if not HASH_MIN <= start <= end <= HASH_MAX:
            check_key_range(start, end, "watermark key range")
        if not 0 <= offset <= OFFSET_MAX:
            _check_offset(offset, "watermark offset")
    effective = [piece for piece in raises if piece[2] > floor]
    if len(effective) == 1:  # the common case: a member commits one watermark per slice
        lift = effective[0]
        if len(stored) <= _SHORT:
            return _raise_one(stored, lift)
        low = bisect_left(stored, lift[0] - 1, key=_end)
        high = bisect_right(stored, lift[1] + 1, key=_start)
        return [*stored[:low], *_raise_one(stored[low:high], lift), *stored[high:]]
    if not effective:
        return stored
    span_start = min(effective)[0]
    span_end = max(map(_end, effective))
    # Stored pieces touching the span (adjacent ones too, so equal neighbours merge) are
    # recomputed; the rest are kept as they are.
    low = bisect_left(stored, span_start - 1, key=_end)
    high = bisect_right(stored, span_end + 1, key=_start)
    middle = _upper_envelope([*stored[low:high], *effective])
    return [*stored[:low], *middle, *stored[high:]]


def _raise_one(pieces: Sequence[Piece], lift: Piece) -> list[Piece]:
    """``_upper_envelope`` of sorted, disjoint ``pieces`` and one more piece, in one pass.

    Every piece goes through ``_emit``, which merges it into the last one when they touch
    and have the same offset."""
    low, high, level = lift
    envelope: list[Piece] = []
    cursor = low  # the first hash of the lift not emitted yet
    for start, end, offset in pieces:
        if end < low:
            _emit(envelope, start, end, offset)
            continue
        if start > high:
            if cursor <= high:
                _emit(envelope, cursor, high, level)
                cursor = high + 1
            _emit(envelope, start, end, offset)
            continue
        if start < low:
            _emit(envelope, start, low - 1, offset)
        elif start > cursor:
            _emit(envelope, cursor, start - 1, level)
        inner_end = end if end < high else high
        _emit(
            envelope, start if start > low else low, inner_end, offset if offset > level else level
        )
        cursor = inner_end + 1
        if end > high:
            _emit(envelope, high + 1, end, offset)
    if cursor <= high:
        _emit(envelope, cursor, high, level)
    return envelope


def _emit(envelope: list[Piece], start: int, end: int, offset: int) -> None:
    if envelope:
        last = envelope[-1]
        if last[1] == start - 1 and last[2] == offset:
            envelope[-1] = (last[0], end, offset)
            return
    envelope.append((start, end, offset))


def _upper_envelope(pieces: Sequence[Piece]) -> list[Piece]:
    """Pointwise max of overlapping pieces, as sorted pieces with equal neighbours merged."""
    bounds = sorted({start for start, _, _ in pieces} | {end + 1 for _, end, _ in pieces})
    by_start = sorted(pieces, key=_start)
    active: list[tuple[int, int]] = []  # heap of (-offset, exclusive end)
    envelope: list[Piece] = []
    next_piece = 0
    for left, right in pairwise(bounds):
        while next_piece < len(by_start) and by_start[next_piece][0] <= left:
            _, end, offset = by_start[next_piece]
            heapq.heappush(active, (-offset, end + 1))
            next_piece += 1
        while active and active[0][1] <= left:
            heapq.heappop(active)
        if not active:
            continue
        level = -active[0][0]
        if envelope and envelope[-1][1] == left - 1 and envelope[-1][2] == level:
            envelope[-1] = (envelope[-1][0], right - 1, level)
        else:
            envelope.append((left, right - 1, level))
    return envelope


def _full_space_minimum(pieces: Sequence[Piece]) -> int | None:
    """min over the whole hash space of W(h), or None where some hash has no piece."""
    if not pieces or pieces[0][0] != HASH_MIN or pieces[-1][1] != HASH_MAX:
        return None
    lowest = pieces[0][2]
    for previous, piece in pairwise(pieces):
        if piece[0] != previous[1] + 1:
            return None
        lowest = min(lowest, piece[2])
    return lowest


def _settle(
    stable: int,
    ranges: Sequence[OffsetRange],
    pieces: Sequence[Piece],
    metadata: str | None,
) -> CommittedOffsets:
    """Move the stable offset to the first offset not known processed and drop what it passed.

    Known processed: below min W over the whole hash space, or inside an IC range. Ranges are
    non-adjacent, so after skipping the one range that may hold the candidate we are done, and
    the ranges kept are those after it. Every piece must be above ``stable``.
    """
    lowest = _full_space_minimum(pieces)
    new_stable = stable if lowest is None or lowest < stable else lowest
    index = bisect_right(ranges, new_stable, key=_start) if ranges else 0
    if index and ranges[index - 1][1] >= new_stable:
        new_stable = ranges[index - 1][1] + 1
        if new_stable > OFFSET_MAX:
            new_stable = OFFSET_MAX
    kept_ranges = ranges[index:] if index else ranges
    # Every piece is above the stable offset it was computed against: only a move drops any.
    kept_pieces = pieces if new_stable == stable else [p for p in pieces if p[2] > new_stable]
    return CommittedOffsets.of_pieces(
        new_stable,
        kept_ranges if type(kept_ranges) is tuple else tuple(kept_ranges),
        kept_pieces if type(kept_pieces) is tuple else tuple(kept_pieces),
        metadata,
    )
