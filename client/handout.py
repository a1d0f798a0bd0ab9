"""What was handed to user code and not marked processed yet: the records a revocation must
wait for (drain) and the ones ``still_owned`` vouches for.

Per partition, records handed out one at a time sit in an offset -> key hash mapping, and the
batches ``getmany`` gave out whole sit, in hand-out order, as runs: ``mark_all_processed`` can
then mark the oldest one without a step per record. Anything that needs a per-record lookup
(a single mark, a revocation) first spreads the partition's runs into the mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from operator import is_

from aiokafka.structs import TopicPartition

from client.fetcher import Record, Run
from client.http import Slices

# A plain tuple finds TopicPartition keys (a NamedTuple) and is cheaper to build.
_Partition = tuple[str, int]


class HandedOut:
    """Records with user code, by partition; a drain waits until none of some slices is."""

    def __init__(self) -> None:
        self._records: dict[_Partition, dict[int, int]] = {}
        self._batches: dict[_Partition, deque[Run]] = {}
        self._marked = asyncio.Event()
        self._draining = 0

    def hand_out(self, tp: _Partition, offset: int, hashed: int) -> None:
        handed = self._records.get(tp)
        if handed is None:
            handed = self._records[tp] = {}
        handed[offset] = hashed

    def hand_out_batch(self, run: Run) -> None:
        batches = self._batches.get(run.tp)
        if batches is None:
            batches = self._batches[run.tp] = deque()
        batches.append(run)

    def take(self, record: Record) -> int | None:
        """The key hash of ``record`` if it was handed out and not marked yet, now marked."""
        tp = (record.topic, record.partition)
        if tp in self._batches:
            self._spread(tp)
        handed = self._records.get(tp)
        if handed is None:
            return None
        hashed = handed.pop(record.offset, None)
        if hashed is not None:
            self._wake_drain()
        return hashed

    def take_oldest_batch(
        self, records: Sequence[Record], mark: Callable[[TopicPartition, list[int]], bool]
    ) -> bool:
        """Mark ``records`` in one step when they are, element for element, the oldest batch
        of their partition still out and ``mark`` (the tracker's) accepts the offsets."""
        first = records[0]
        batches = self._batches.get((first.topic, first.partition))
        if not batches:
            return False
        oldest = batches[0]
        if (
            len(oldest.records) == len(records)
            and all(map(is_, records, oldest.records))
            and mark(oldest.tp, oldest.offsets)
        ):
            batches.popleft()
            self._wake_drain()
            return True
        return False

    def holds(self, record: Record) -> bool:
        tp = (record.topic, record.partition)
        handed = self._records.get(tp)
        if handed is not None and record.offset in handed:
            return True
        return any(run.holds(record.offset) for run in self._batches.get(tp, ()))

    def forget(self, slices: Slices) -> None:
        """Stop waiting for records of ``slices`` (they are released without them)."""
        for tp, ranges in slices.items():
            self._spread(tp)
            handed = self._records.get(tp)
            if not handed:
                continue
            for offset in [o for o, h in handed.items() if any(r.contains(h) for r in ranges)]:
                del handed[offset]

    def clear(self) -> None:
        self._records.clear()
        self._batches.clear()

    async def drain(self, slices: Slices, timeout_s: float) -> bool:
        """Until no record of ``slices`` is with user code (True), or ``timeout_s`` (False)."""
        deadline = time.monotonic() + timeout_s
        self._draining += 1
        try:
            while self.any_in(slices):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._marked.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._marked.wait(), remaining)
            return True
        finally:
            self._draining -= 1

    def any_in(self, slices: Slices) -> bool:
        for tp, ranges in slices.items():
            self._spread(tp)
            for hashed in self._records.get(tp, {}).values():
                if any(r.contains(hashed) for r in ranges):
                    return True
        return False

    def _spread(self, tp: _Partition) -> None:
        """Move the partition's outstanding ``getmany`` batches into the per-record mapping."""
        batches = self._batches.pop(tp, None)
        if not batches:
            return
        handed = self._records.get(tp)
        if handed is None:
            handed = self._records[tp] = {}
        for run in batches:
            handed.update(zip(run.offsets, run.hashes, strict=True))

    def _wake_drain(self) -> None:
        if self._draining:
            self._marked.set()
