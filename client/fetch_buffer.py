"""The fetched records of a member's slices that wait to be handed out, in fetch order.

Filled from the raw filter's judged batches (``client.raw_filter``): each batch's kept records
are registered with the tracker (which drops what the group committed as individual offsets)
and buffered as one ``Run``; emptied by ``take_one``/``take_batch``, or taken back when slices
are being revoked (``drop``) or lost (``clear``).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from itertools import compress
from typing import Any, TypeAlias

from aiokafka.structs import TopicPartition

from client.http import Slices
from client.protocol.keyspace import in_ranges
from client.raw_filter import Judged
from client.tracker import OffsetTracker

# aiokafka ships no type information; at runtime this is ``aiokafka.structs.ConsumerRecord``.
Record: TypeAlias = Any
Item = tuple[TopicPartition, Record, int]


class Run:
    """Fetched records of one partition to hand out, in offset order, with their offsets and
    key hashes; ``next`` is the first not handed out. Whole fetches are buffered this way
    because a tuple per record kept the garbage collector busy."""

    __slots__ = ("hashes", "next", "offsets", "records", "tp")

    def __init__(
        self, tp: TopicPartition, records: list[Record], offsets: list[int], hashes: list[int]
    ) -> None:
        self.tp = tp
        self.records = records
        self.offsets = offsets
        self.hashes = hashes
        self.next = 0

    def holds(self, offset: int) -> bool:
        index = bisect.bisect_left(self.offsets, offset)
        return index < len(self.offsets) and self.offsets[index] == offset


class FetchBuffer:
    """Runs not handed out yet, in fetch order; never holds an exhausted run."""

    def __init__(self, tracker: OffsetTracker) -> None:
        self._tracker = tracker
        self._runs: deque[Run] = deque()

    def __bool__(self) -> bool:
        return bool(self._runs)

    def count(self) -> int:
        return sum(len(run.records) - run.next for run in self._runs)

    def add(self, tp: TopicPartition, batches: Sequence[Judged]) -> None:
        """Hot path: register and keep each batch's records that still need processing, and
        count every judged record as seen."""
        tracker = self._tracker
        for judged in batches:
            if judged.records:
                self._keep(tp, judged)
            tracker.advance(tp, judged.next_offset)

    def _keep(self, tp: TopicPartition, judged: Judged) -> None:
        active = [progress for progress in self._tracker.slices_of(tp) if progress.active]
        if len(active) == 1 and active[0].accept_run(judged.offsets, judged.hashes):
            # The common case in one step: one owned slice and a batch wholly past what it
            # has seen and what the group committed.
            self._runs.append(Run(tp, judged.records, judged.offsets, judged.hashes))
            return
        accept = self._tracker.accept
        keep = [
            accept(tp, offset, hashed)
            for offset, hashed in zip(judged.offsets, judged.hashes, strict=True)
        ]
        records = list(compress(judged.records, keep))
        if records:
            offsets = list(compress(judged.offsets, keep))
            self._runs.append(Run(tp, records, offsets, list(compress(judged.hashes, keep))))

    def take_one(self) -> Item:
        run = self._runs[0]
        index = run.next
        run.next = index + 1
        if run.next == len(run.records):
            self._runs.popleft()
        return run.tp, run.records[index], run.hashes[index]

    def take_batch(self, max_records: int | None) -> dict[TopicPartition, Run]:
        """Up to ``max_records`` buffered records (all with None) as one run per partition;
        whole runs move as list slices, with no Python step per record."""
        remaining = self.count() if max_records is None else max_records
        handed: dict[TopicPartition, Run] = {}
        while self._runs and remaining > 0:
            run = self._runs[0]
            start = run.next
            end = min(len(run.records), start + remaining)
            remaining -= end - start
            taken = handed.get(run.tp)
            if taken is None:
                handed[run.tp] = Run(
                    run.tp, run.records[start:end], run.offsets[start:end], run.hashes[start:end]
                )
            else:
                taken.records += run.records[start:end]
                taken.offsets += run.offsets[start:end]
                taken.hashes += run.hashes[start:end]
            if end == len(run.records):
                self._runs.popleft()
            else:
                run.next = end
        return handed

    def drop(self, slices: Slices) -> None:
        """Drop buffered records of ``slices``: they are not to be handed out any more."""
        kept_runs: deque[Run] = deque()
        for run in self._runs:
            left = run.hashes[run.next :]
            keep = [not in_slices(slices, run.tp, hashed) for hashed in left]
            records = list(compress(run.records[run.next :], keep))
            if records:
                offsets = list(compress(run.offsets[run.next :], keep))
                kept_runs.append(Run(run.tp, records, offsets, list(compress(left, keep))))
        self._runs = kept_runs

    def clear(self) -> None:
        self._runs.clear()


def in_slices(slices: Slices, tp: TopicPartition, hashed: int) -> bool:
    ranges = slices.get(tp)
    return ranges is not None and in_ranges(ranges, hashed)
