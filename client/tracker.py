"""Which of its own records a consumer has processed, and what to commit for them.

Pure bookkeeping, no I/O: the consumer registers every record of an owned slice as it
examines the fetched stream (in offset order), marks records processed in any order, and
asks for a commit payload. The payload follows docs/design.md §3a: per owned slice ONE watermark,
the lowest own offset registered but not yet processed (else the slice's read position), and
IC ranges only for own offsets processed out of order above it. IC ranges cover offsets this
consumer actually processed and nothing else; offsets of other slices between two of ours are
not ours to claim, so ranges are never bridged across them. Mode ``"ranges"`` commits plain
IC ranges, as the KIP's "gap amending" does (docs/design.md §3); mode ``"offset"`` commits a classic
offset (the lowest unprocessed one) for a member that owns whole partitions and does not use
individual commit (``allow.individual.commit=false``).

A slice is a ``(TopicPartition, KeyRange)``; several slices of one partition keep separate
read positions because a slice added later may have to re-read offsets the others are past.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal

from aiokafka.structs import TopicPartition

from client.http import PartitionCommit, PartitionCommitReply
from client.protocol import error_names as names
from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import KeyRange, intersect, normalize
from client.protocol.log_bounds import committed_reach

CommitMode = Literal["watermarks", "ranges", "offset"]


def _first_offsets(
    start: int, end: int, floor: int, committed: CommittedOffsets | None
) -> list[tuple[int, int, int]]:
    """``(hash start, hash end, first offset)`` pieces of the hashes ``[start, end]``: each
    piece's first offset is ``floor`` or, where the group's committed state covers the piece
    further (its stable offset, a watermark piece), that."""
    if committed is None:
        return [(start, end, floor)]
    floor = max(floor, committed.stable_offset)
    pieces: list[tuple[int, int, int]] = []
    cursor = start
    for piece_start, piece_end, offset in committed.pieces:
        if piece_end < cursor:
            continue
        if piece_start > end:
            break
        low, high = max(piece_start, cursor), min(piece_end, end)
        if low > cursor:
            pieces.append((cursor, low - 1, floor))
        pieces.append((low, high, max(floor, offset)))
        cursor = high + 1
    if cursor <= end:
        pieces.append((cursor, end, floor))
    return pieces


class SliceProgress:
    """Progress of one owned slice. ``pending_offsets`` holds every registered own record not
    yet passed by the watermark, in offset order, and ``pending_hashes`` their key hashes
    (two deques of ints rather than one of pairs: a pair per consumed record kept the garbage
    collector busy); ``completed`` are the pending ones already processed (out of order),
    ``uncommitted`` the processed offsets an IC range must still carry, with their key
    hashes."""

    __slots__ = (
        "_committed",
        "_committed_until",
        "active",
        "committed_watermark",
        "completed",
        "keys",
        "pending_hashes",
        "pending_offsets",
        "position",
        "resumed_from",
        "runs",
        "uncommitted",
    )

    def __init__(
        self,
        keys: KeyRange,
        position: int,
        committed: CommittedOffsets | None,
    ) -> None:
        self.keys = keys
        self.position = position
        self.committed_watermark = position
        self.active = True
        self.pending_offsets: deque[int] = deque()
        self.pending_hashes: deque[int] = deque()
        self.completed: set[int] = set()
        self.uncommitted: dict[int, int] = {}
        self.runs = 0
        self._committed = committed
        # Kept whole (``_committed`` is dropped once read past): ``starts`` needs it.
        self.resumed_from = committed
        # Past this offset the committed state says nothing more, so the per-record check
        # can stop asking it.
        self._committed_until = 0 if committed is None else committed_reach(committed)

    @property
    def reach(self) -> int:
        """The first offset past everything this slice has seen or takes as processed from the
        group's state: beyond the log end, the slice works from a log that is gone."""
        return max(self.position, self._committed_until)

    @property
    def watermark(self) -> int:
        return self.pending_offsets[0] if self.pending_offsets else self.position

    def starts(self, keys: KeyRange) -> list[tuple[KeyRange, int]]:
        """Where processing starts for each part of ``keys`` within this slice: its first
        offset not processed yet, or the group's watermark of that part where the slice
        resumed below it (those records are skipped as processed). A streams task restores
        a source-topic table up to these (``client.streams.restoring``). IC ranges are not
        looked at: a streams application, processing in order, commits none."""
        low, high = max(keys.start, self.keys.start), min(keys.end, self.keys.end)
        if low > high:
            return []
        pieces = _first_offsets(low, high, self.watermark, self.resumed_from)
        return [(KeyRange(start, end), offset) for start, end, offset in pieces]

    def bounds(self) -> list[tuple[int, int, int]]:
        """``(hash start, hash end, first offset)`` pieces of this slice for the raw filter
        (``client.raw_filter``): below its first offset a record of a piece needs no look,
        as the slice saw it already or a committed watermark covers it. IC ranges are left to
        ``accept``, which sees the records kept."""
        return _first_offsets(self.keys.start, self.keys.end, self.position, self._committed)

    def accept(self, offset: int, key_hash: int) -> bool:
        """Register a record of this slice met in the stream; False when it needs no
        processing (seen before by this slice, or already committed by the group)."""
        if offset < self.position:
            return False
        self.position = offset + 1
        committed = self._committed
        if committed is not None:
            if offset >= self._committed_until:
                self._committed = None
            elif committed.is_processed(offset, key_hash):
                return False
        self.pending_offsets.append(offset)
        self.pending_hashes.append(key_hash)
        return True

    def accept_run(self, offsets: Sequence[int], hashes: Sequence[int]) -> bool:
        """Register, in one step, records of this slice that lie past its read position and
        past everything the committed state says; False (nothing registered) otherwise, and
        the caller offers them one by one to ``accept``."""
        first = offsets[0]
        if first < self.position or (self._committed is not None and first < self._committed_until):
            return False
        self._committed = None
        self.pending_offsets.extend(offsets)
        self.pending_hashes.extend(hashes)
        self.position = offsets[-1] + 1
        return True

    def mark(self, offset: int, key_hash: int, mode: CommitMode) -> None:
        pending = self.pending_offsets
        if pending and pending[0] == offset:
            pending.popleft()
            self.pending_hashes.popleft()
            if mode == "ranges":
                self._add_uncommitted(offset, key_hash)
            if self.completed:
                self._settle(mode)
            return
        if offset < self.watermark or offset >= self.position or offset in self.completed:
            return  # not registered here (dropped below the stable offset) or marked twice
        self.completed.add(offset)
        if mode != "offset":
            self._add_uncommitted(offset, key_hash)

    def mark_head(self, offsets: Sequence[int]) -> bool:
        """Mark, in one step, records that are exactly the oldest pending ones in offset order
        (what a consumer processing in order marks); False, with nothing marked, otherwise.
        Only the watermark moves, so this is not for mode ``"ranges"``."""
        pending = self.pending_offsets
        count = len(offsets)
        if self.completed or count > len(pending) or list(islice(pending, count)) != offsets:
            return False
        if count == len(pending):
            pending.clear()
            self.pending_hashes.clear()
            return True
        hashes = self.pending_hashes
        for _ in range(count):
            pending.popleft()
            hashes.popleft()
        return True

    def _settle(self, mode: CommitMode) -> None:
        # The watermark moves past every processed record at the head of the pending ones.
        pending, completed = self.pending_offsets, self.completed
        while pending and pending[0] in completed:
            done = pending.popleft()
            self.pending_hashes.popleft()
            completed.discard(done)
            if mode == "watermarks":
                self.forget_uncommitted(done)

    def _add_uncommitted(self, offset: int, key_hash: int) -> None:
        uncommitted = self.uncommitted
        if offset in uncommitted:
            return
        self.runs += 1 - ((offset - 1) in uncommitted) - ((offset + 1) in uncommitted)
        uncommitted[offset] = key_hash

    def forget_uncommitted(self, offset: int) -> None:
        uncommitted = self.uncommitted
        if offset not in uncommitted:
            return
        del uncommitted[offset]
        self.runs -= 1 - ((offset - 1) in uncommitted) - ((offset + 1) in uncommitted)

    def drop_below(self, stable_offset: int) -> None:
        """Everything below the group's stable offset is processed: forget it."""
        pending = self.pending_offsets
        while pending and pending[0] < stable_offset:
            done = pending.popleft()
            self.pending_hashes.popleft()
            self.completed.discard(done)
        for offset in [o for o in self.uncommitted if o < stable_offset]:
            self.forget_uncommitted(offset)
        self.position = max(self.position, stable_offset)
        self.committed_watermark = max(self.committed_watermark, stable_offset)

    def restricted_to(self, keys: KeyRange, mode: CommitMode) -> SliceProgress:
        """The same progress for a sub-range: records of other hashes are left out."""
        part = SliceProgress(keys, self.position, self._committed)
        part.resumed_from = self.resumed_from
        part.committed_watermark = self.committed_watermark
        part.active = self.active
        kept = [
            (offset, key_hash)
            for offset, key_hash in zip(self.pending_offsets, self.pending_hashes, strict=True)
            if keys.contains(key_hash)
        ]
        part.pending_offsets = deque(offset for offset, _ in kept)
        part.pending_hashes = deque(key_hash for _, key_hash in kept)
        part.completed = {offset for offset in part.pending_offsets if offset in self.completed}
        for offset, key_hash in self.uncommitted.items():
            if keys.contains(key_hash):
                part._add_uncommitted(offset, key_hash)
        part._settle(mode)
        return part


@dataclass(frozen=True)
class CommitBatch:
    """A commit payload plus what it claims, so a success can be applied to the state that
    may have moved on while the request was in flight."""

    partitions: list[PartitionCommit]
    claimed_offsets: dict[TopicPartition, list[int]] = field(repr=False)
    claimed_watermarks: dict[TopicPartition, dict[KeyRange, int]] = field(repr=False)


class OffsetTracker:
    """Processed-offset bookkeeping for every slice a consumer owns."""

    def __init__(self, *, mode: CommitMode = "watermarks") -> None:
        self.mode: CommitMode = mode
        self._slices: dict[TopicPartition, list[SliceProgress]] = {}
        # Kept as a running total because the consumer checks it after every mark.
        self._runs_total = 0

    def add_slice(
        self,
        tp: TopicPartition,
        keys: KeyRange,
        *,
        position: int,
        committed: CommittedOffsets | None = None,
    ) -> None:
        """Start tracking a slice read from ``position`` (where its records may begin)."""
        slices = self._slices.setdefault(tp, [])
        if any(existing.keys.overlaps(keys) for existing in slices):
            raise ValueError(f"{tp} already tracks a slice overlapping {keys}")
        slices.append(SliceProgress(keys, position, committed))
        slices.sort(key=lambda progress: progress.keys.start)

    def restart(
        self,
        tp: TopicPartition,
        position_of: Callable[[KeyRange], int],
        committed: CommittedOffsets | None,
    ) -> list[KeyRange]:
        """Start the active slices of ``tp`` over from ``position_of(keys)`` with ``committed``
        as the group's state (the read position was outside the log); what they registered
        before is dropped, since it belongs to a log that is gone. Returns their key ranges."""
        restarted: list[KeyRange] = []
        slices: list[SliceProgress] = []
        for progress in self._slices.get(tp, ()):
            if progress.active:
                restarted.append(progress.keys)
                progress = SliceProgress(progress.keys, position_of(progress.keys), committed)
            slices.append(progress)
        if slices:
            self._slices[tp] = slices
        self._recount()
        return restarted

    def partitions(self) -> list[TopicPartition]:
        return list(self._slices)

    def slices_of(self, tp: TopicPartition) -> Sequence[SliceProgress]:
        return self._slices.get(tp, ())

    def owned(self) -> dict[TopicPartition, list[KeyRange]]:
        """Active slices: the ranges whose records are still handed out."""
        owned: dict[TopicPartition, list[KeyRange]] = {}
        for tp, slices in self._slices.items():
            ranges = [progress.keys for progress in slices if progress.active]
            if ranges:
                owned[tp] = normalize(ranges)
        return owned

    def read_position(self, tp: TopicPartition) -> int | None:
        """Where reading the partition must (re)start so every active slice sees its records."""
        positions = [progress.position for progress in self._slices.get(tp, ()) if progress.active]
        return min(positions) if positions else None

    def reach(self, tp: TopicPartition) -> int | None:
        """The furthest ``SliceProgress.reach`` of the partition's active slices."""
        reaches = [progress.reach for progress in self._slices.get(tp, ()) if progress.active]
        return max(reaches) if reaches else None

    def bounds(self, tp: TopicPartition) -> list[tuple[int, int, int]]:
        """The raw filter's bounds of the partition's active slices (``SliceProgress.bounds``)."""
        return [
            piece
            for progress in self._slices.get(tp, ())
            if progress.active
            for piece in progress.bounds()
        ]

    def accept(self, tp: TopicPartition, offset: int, key_hash: int) -> bool:
        """Register a fetched record; True when it is ours and still needs processing."""
        for progress in self._slices.get(tp, ()):
            if progress.keys.contains(key_hash):
                return progress.active and progress.accept(offset, key_hash)
        return False

    def advance(self, tp: TopicPartition, position: int) -> None:
        """Every record of the partition below ``position`` has been offered to ``accept``."""
        for progress in self._slices.get(tp, ()):
            if progress.active and progress.position < position:
                progress.position = position

    def mark_processed(self, tp: TopicPartition, offset: int, key_hash: int) -> None:
        """Out-of-order marks are fine; marks for slices no longer tracked are ignored."""
        for progress in self._slices.get(tp, ()):
            if progress.keys.contains(key_hash):
                before = progress.runs
                progress.mark(offset, key_hash, self.mode)
                self._runs_total += progress.runs - before
                return

    def mark_head(self, tp: TopicPartition, offsets: Sequence[int]) -> bool:
        """Bulk ``mark_processed`` for the common case: the partition has one slice and
        ``offsets`` are its oldest pending records in order. False, with nothing marked, when
        that does not hold; the caller then marks one by one."""
        slices = self._slices.get(tp)
        if slices is None or len(slices) != 1 or self.mode == "ranges" or not offsets:
            return False
        return slices[0].mark_head(offsets)

    def deactivate(self, tp: TopicPartition, keys: Iterable[KeyRange]) -> None:
        """Stop accepting records of ``keys`` (being revoked) but keep their progress so the
        final commit can carry their watermark; slices are split where ``keys`` cut them."""
        revoked = normalize(keys)
        result: list[SliceProgress] = []
        for progress in self._slices.get(tp, ()):
            cut = intersect([progress.keys], revoked)
            if not cut:
                result.append(progress)
                continue
            kept = _subtract_one(progress.keys, cut)
            for piece in kept:
                result.append(progress.restricted_to(piece, self.mode))
            for piece in cut:
                part = progress.restricted_to(piece, self.mode)
                part.active = False
                result.append(part)
        if result:
            result.sort(key=lambda progress: progress.keys.start)
            self._slices[tp] = result
        self._recount()

    def remove_inactive(
        self,
        within: Mapping[TopicPartition, Sequence[KeyRange]] | None = None,
        *,
        keep: Mapping[TopicPartition, Sequence[KeyRange]] | None = None,
    ) -> None:
        """Forget deactivated slices (after their final commit) that lie in ``within``
        (every one with None), except their parts in ``keep``: keys a call that cannot be
        stopped still runs, which the member goes on reporting as owned until it ends."""
        for tp in list(self._slices):
            result: list[SliceProgress] = []
            for progress in self._slices[tp]:
                if progress.active or (within is not None and not _within(within, tp, progress)):
                    result.append(progress)
                    continue
                for piece in intersect([progress.keys], keep.get(tp, ()) if keep else ()):
                    part = progress.restricted_to(piece, self.mode)
                    part.active = False
                    result.append(part)
            if result:
                self._slices[tp] = result
            else:
                del self._slices[tp]
        self._recount()

    def clear(self) -> dict[TopicPartition, list[KeyRange]]:
        """Forget everything (slices lost): nothing of it may be committed any more."""
        owned = {tp: [p.keys for p in slices] for tp, slices in self._slices.items()}
        self._slices.clear()
        self._runs_total = 0
        return owned

    @property
    def uncommitted_ranges(self) -> int:
        """An upper bound of the IC ranges the next commit would carry."""
        return self._runs_total

    def _recount(self) -> None:
        self._runs_total = sum(
            progress.runs for slices in self._slices.values() for progress in slices
        )

    def prepare_commit(self, *, max_ranges: int = 60_000) -> CommitBatch | None:
        """What to commit now, or None when everything is already committed.

        ``max_ranges`` caps the IC ranges of one request (the coordinator's
        ``max_ranges_per_request``); lower ranges go first, the rest waits for the next one.
        """
        partitions: list[PartitionCommit] = []
        claimed_offsets: dict[TopicPartition, list[int]] = {}
        claimed_watermarks: dict[TopicPartition, dict[KeyRange, int]] = {}
        budget = max_ranges
        for tp, slices in self._slices.items():
            if self.mode == "offset" and _covers_whole_partition(slices):
                offset = min(progress.watermark for progress in slices)
                if offset > min(progress.committed_watermark for progress in slices):
                    claimed_watermarks[tp] = {progress.keys: offset for progress in slices}
                    partitions.append(PartitionCommit(tp.topic, tp.partition, offset=offset))
                continue
            watermarks: list[Watermark] = []
            if self.mode != "ranges":
                for progress in slices:
                    mark = progress.watermark
                    if mark > progress.committed_watermark:
                        watermarks.append(Watermark(progress.keys, mark))
            offsets = sorted(offset for progress in slices for offset in progress.uncommitted)
            ranges = _runs(offsets, budget)
            budget -= len(ranges)
            if not watermarks and not ranges:
                continue
            if ranges:
                last = ranges[-1][1]
                claimed_offsets[tp] = [offset for offset in offsets if offset <= last]
            claimed_watermarks[tp] = {piece.keys: piece.offset for piece in watermarks}
            partitions.append(
                PartitionCommit(tp.topic, tp.partition, ranges=ranges, watermarks=watermarks)
            )
        if not partitions:
            return None
        return CommitBatch(partitions, claimed_offsets, claimed_watermarks)

    def commit_succeeded(
        self, batch: CommitBatch, replies: Iterable[PartitionCommitReply]
    ) -> list[PartitionCommitReply]:
        """Apply a commit reply; returns the partitions whose entry was not applied
        (``MAX_INDIVIDUAL_COMMIT_REACHED``), which stay uncommitted for a later try."""
        refused: list[PartitionCommitReply] = []
        for reply in replies:
            tp = reply.topic_partition
            slices = self._slices.get(tp)
            if slices is None:
                continue
            if reply.error is None or reply.error == names.INDIVIDUAL_COMMIT_TOO_OLD:
                self._apply_claims(
                    slices, batch.claimed_offsets.get(tp, ()), batch.claimed_watermarks.get(tp, {})
                )
            else:
                refused.append(reply)
            for progress in slices:
                progress.drop_below(reply.last_stable_offset)
        self._recount()
        return refused

    def _apply_claims(
        self,
        slices: Sequence[SliceProgress],
        offsets: Iterable[int],
        watermarks: Mapping[KeyRange, int],
    ) -> None:
        for progress in slices:
            # A slice split after the payload was built inherits its parent's watermark.
            for keys, mark in watermarks.items():
                if keys.start <= progress.keys.start and progress.keys.end <= keys.end:
                    progress.committed_watermark = max(progress.committed_watermark, mark)
        for offset in offsets:
            for progress in slices:
                if offset in progress.uncommitted:
                    progress.forget_uncommitted(offset)
                    break


def _within(
    slices: Mapping[TopicPartition, Sequence[KeyRange]], tp: TopicPartition, progress: SliceProgress
) -> bool:
    return any(
        keys.start <= progress.keys.start and progress.keys.end <= keys.end
        for keys in slices.get(tp, ())
    )


def _covers_whole_partition(slices: Sequence[SliceProgress]) -> bool:
    return normalize(progress.keys for progress in slices) == [KeyRange.full()]


def _runs(sorted_offsets: Sequence[int], limit: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    if limit <= 0 or not sorted_offsets:
        return runs
    start = previous = sorted_offsets[0]
    for offset in sorted_offsets[1:]:
        if offset == previous + 1:
            previous = offset
            continue
        runs.append((start, previous))
        if len(runs) == limit:
            return runs
        start = previous = offset
    runs.append((start, previous))
    return runs


def _subtract_one(keys: KeyRange, cuts: Sequence[KeyRange]) -> list[KeyRange]:
    pieces: list[KeyRange] = []
    start = keys.start
    for cut in cuts:
        if cut.start > start:
            pieces.append(KeyRange(start, cut.start - 1))
        start = cut.end + 1
    if start <= keys.end:
        pieces.append(KeyRange(start, keys.end))
    return pieces
