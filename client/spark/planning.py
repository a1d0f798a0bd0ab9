"""Pure planning for the Spark source: slices, admission control, stream offsets, commits.

No I/O here: the driver-side shells fetch high watermarks and committed state, then hand
them to these functions, so every decision about what a task reads and what a batch
reports is testable on plain values.

A partition's work in one Spark batch is a *span*: the offsets ``[start, end)`` for the
whole key space, plus the ``origin`` where this query began reading the partition. The
origin makes every commit report everything from the origin to the batch end, so a report
lost (driver crash after Spark's own commit) is repaired by the next batch's report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.structs import TopicPartition

from client.http import PartitionCommit
from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import KeyRange, normalize
from client.spark.options import SliceBy

OFFSET_FORMAT_VERSION = 1
_EXPLICIT = "explicit"


@dataclass(frozen=True, slots=True)
class PartitionSpan:
    """Offsets ``[start, end)`` of one partition, read since ``origin`` by this query.

    ``explicit`` as in ``Position``.
    """

    topic: str
    partition: int
    origin: int
    start: int
    end: int
    explicit: bool = False

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Slice:
    """One Spark task: records of ``[start, end)`` whose key hash is in ``keys``.

    ``committed`` is the group's state at planning time (trimmed to this slice), as
    ``CommittedOffsets.to_json``: plain data pickles cheaply and safely to executors.
    """

    topic: str
    partition: int
    keys: KeyRange
    start: int
    end: int
    committed: dict[str, Any] | None = None

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def plan_slices(
    spans: Iterable[PartitionSpan],
    slices_per_partition: int | Mapping[TopicPartition, int],
    slice_by: SliceBy,
    committed: Mapping[TopicPartition, CommittedOffsets],
) -> list[Slice]:
    """Split each span into slices, skipping what the group has provably processed.

    ``slices_per_partition``: one count for every span, or a count per partition.
    A slice starts at its key range's lowest watermark when that is above the span start:
    below it every record of the range is processed, so reading it would be wasted.
    """
    slices: list[Slice] = []
    for span in sorted(spans, key=lambda s: (s.topic, s.partition)):
        state = committed.get(span.topic_partition)
        count = (
            slices_per_partition
            if isinstance(slices_per_partition, int)
            else slices_per_partition.get(span.topic_partition, 1)
        )
        if slice_by == "keys":
            for keys in KeyRange.full().split(count):
                start = _skip_processed(span.start, keys, state)
                if start < span.end:
                    slices.append(_slice(span, keys, start, span.end, state))
        else:
            keys = KeyRange.full()
            start = _skip_processed(span.start, keys, state)
            for part_start, part_end in split_offsets(start, span.end, count):
                slices.append(_slice(span, keys, part_start, part_end, state))
    return slices


def split_offsets(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` in at most ``parts`` contiguous pieces whose sizes differ by at most one."""
    count = end - start
    if count <= 0:
        return []
    parts = min(parts, count)
    base, extra = divmod(count, parts)
    pieces = []
    for index in range(parts):
        length = base + (1 if index < extra else 0)
        pieces.append((start, start + length))
        start += length
    return pieces


def _skip_processed(start: int, keys: KeyRange, state: CommittedOffsets | None) -> int:
    return start if state is None else max(start, state.min_watermark(keys))


def _slice(
    span: PartitionSpan, keys: KeyRange, start: int, end: int, state: CommittedOffsets | None
) -> Slice:
    trimmed = None if state is None else trim_committed(state, keys, start, end).to_json()
    return Slice(span.topic, span.partition, keys, start, end, trimmed)


def trim_committed(
    state: CommittedOffsets, keys: KeyRange, start: int, end: int
) -> CommittedOffsets:
    """The part of ``state`` that can decide a record of ``[start, end)`` with hash in ``keys``.

    A partition may hold thousands of IC ranges; each task needs only those overlapping its
    slice, and it is shipped to every task.
    """
    return CommittedOffsets(
        stable_offset=state.stable_offset,
        ranges=tuple((low, high) for low, high in state.ranges if low < end and high >= start),
        watermarks=tuple(
            piece
            for piece in state.watermarks
            if piece.keys.overlaps(keys) and piece.offset > start
        ),
    )


def admit(backlog: Mapping[TopicPartition, int], max_records: int) -> dict[TopicPartition, int]:
    """Records each partition may add to a batch, at most ``max_records`` in all.

    Shared in proportion to each partition's backlog, as Spark's Kafka source does with
    ``maxOffsetsPerTrigger``, so a large backlog cannot starve the others; the rounding
    remainder goes to the largest backlogs so the batch is as full as allowed.
    """
    waiting = {tp: count for tp, count in backlog.items() if count > 0}
    total = sum(waiting.values())
    if total <= max_records:
        return dict(waiting)
    shares = {tp: count * max_records // total for tp, count in waiting.items()}
    remainder = max_records - sum(shares.values())
    for tp in sorted(waiting, key=lambda tp: (-waiting[tp], tp)):
        if remainder == 0:
            break
        if shares[tp] < waiting[tp]:
            shares[tp] += 1
            remainder -= 1
    return {tp: count for tp, count in shares.items() if count > 0}


@dataclass(frozen=True, slots=True)
class Position:
    """Per partition in a stream offset: where the query began, and the next offset to read.

    ``explicit``: ``starting_offsets`` (JSON or ``latest``) put the origin above the log
    start. The records below it were then neither read nor passed over by the group's own
    position rules, so no report may claim them (``plan_commits``).
    """

    origin: int
    next: int
    explicit: bool = False


def stream_offset(
    group: str | None, positions: Mapping[TopicPartition, Position]
) -> dict[str, Any]:
    """A Spark stream offset: JSON-safe, per partition, and self-describing for the listener."""
    partitions: dict[str, dict[str, list[int | str]]] = {}
    for tp in sorted(positions):
        position = positions[tp]
        pair: list[int | str] = [position.origin, position.next]
        # A tag rather than a new format version: checkpoints written before it still parse.
        partitions.setdefault(tp.topic, {})[str(tp.partition)] = (
            [*pair, _EXPLICIT] if position.explicit else pair
        )
    return {"keyrange": OFFSET_FORMAT_VERSION, "group": group, "partitions": partitions}


def is_stream_offset(document: object) -> bool:
    return isinstance(document, dict) and document.get("keyrange") == OFFSET_FORMAT_VERSION


def positions_of(document: Mapping[str, Any]) -> dict[TopicPartition, Position]:
    if not is_stream_offset(document):
        raise ValueError(f"not a keyrange stream offset: {document!r}")
    return {
        TopicPartition(topic, int(partition)): Position(
            int(pair[0]), int(pair[1]), explicit=pair[2:] == [_EXPLICIT]
        )
        for topic, partitions in document["partitions"].items()
        for partition, pair in partitions.items()
    }


def group_of(document: Mapping[str, Any]) -> str | None:
    group = document.get("group")
    return group if isinstance(group, str) else None


def plan_commits(
    positions: Mapping[TopicPartition, Position],
    committed: Mapping[TopicPartition, CommittedOffsets],
) -> list[PartitionCommit]:
    """What to report once every record of ``[origin, next)`` of each partition is processed.

    Where the group's watermark already reaches the origin (the span started at its range's
    watermark), everything below ``next`` is processed: a watermark says so and keeps the
    stored state small (docs/design.md §3a). Elsewhere the records below the origin are unknown, so
    only the span itself is reported, as an IC range. A partition the group never committed
    reports a watermark when its origin is the group's own choice (``auto_offset_reset``, as
    a Kafka consumer's offset reset and first commit would) or the log start; an explicit
    origin above the log start reports the span alone, since a watermark would tell every
    reader of the group that the records before it, which nothing read, are processed.
    """
    commits = []
    for tp in sorted(positions):
        position = positions[tp]
        if position.next <= position.origin:
            continue
        state = committed.get(tp)
        if state is not None:
            covered = _keys_processed_below(state, position.origin)
        else:
            covered = [] if position.explicit else [KeyRange.full()]
        watermarks = tuple(Watermark(keys, position.next) for keys in covered)
        whole = covered == [KeyRange.full()]
        commits.append(
            PartitionCommit(
                topic=tp.topic,
                partition=tp.partition,
                ranges=() if whole else ((position.origin, position.next - 1),),
                watermarks=watermarks,
            )
        )
    return commits


def _keys_processed_below(state: CommittedOffsets, offset: int) -> list[KeyRange]:
    """Key ranges whose every record below ``offset`` is processed (W(h) >= offset)."""
    if state.stable_offset >= offset:
        return [KeyRange.full()]
    return normalize(piece.keys for piece in state.watermarks if piece.offset >= offset)


def spans_between(
    start: Mapping[TopicPartition, Position], end: Mapping[TopicPartition, Position]
) -> list[PartitionSpan]:
    spans = []
    for tp, stop in end.items():
        begin = start.get(tp)
        if begin is None or begin.origin != stop.origin or begin.next > stop.next:
            # New to the query, or restarted because its position was past the log end.
            begin = Position(stop.origin, stop.origin)
        if stop.next > begin.next:
            spans.append(
                PartitionSpan(
                    tp.topic, tp.partition, stop.origin, begin.next, stop.next, stop.explicit
                )
            )
    return spans


def advance(
    start: Mapping[TopicPartition, Position],
    latest: Mapping[TopicPartition, int],
    max_records: int | None,
) -> dict[TopicPartition, Position]:
    """The end offset of the next batch: up to ``latest``, at most ``max_records`` more."""
    backlog = {tp: max(0, latest.get(tp, p.next) - p.next) for tp, p in start.items()}
    admitted = backlog if max_records is None else admit(backlog, max_records)
    return {
        tp: Position(p.origin, p.next + admitted.get(tp, 0), p.explicit)
        for tp, p in sorted(start.items())
    }
