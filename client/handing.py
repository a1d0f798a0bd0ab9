"""The consumer's hand-out API: ``async for`` (``records``), ``getmany`` and the marks, over
the fetcher's buffer and the hand-out ledger (``client.handout``).

Records of one key reach user code in offset order and one at a time: both hand records
out in partition order. Nothing is handed out once the membership is lost: each hand-out
asks the status's guard first (docs/design.md §5). Delivery is at least once; a record counts
as processed when it is marked: ``async for`` marks the previous record when the next one is
requested (unless ``auto_mark=False``), ``getmany`` leaves marking to the caller.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable

from aiokafka.structs import TopicPartition

from client.committer import Committer
from client.errors import ConsumerStopped
from client.fetcher import Fetcher, Record
from client.handout import HandedOut
from client.http import Slices
from client.runtime.hooks import LifecycleHooks
from client.status import ConsumerStatus
from client.tracker import OffsetTracker


class HandOut(LifecycleHooks):
    """Hands records to user code and takes their marks. A part of the lifecycle hooks: a
    loss takes away the record ``async for`` was to mark next."""

    def __init__(
        self,
        fetcher: Fetcher,
        handed: HandedOut,
        tracker: OffsetTracker,
        committer: Committer,
        status: ConsumerStatus,
        *,
        max_ranges: int,
    ) -> None:
        self._fetcher = fetcher
        self._handed = handed
        self._tracker = tracker
        self._committer = committer
        self._status = status
        self._max_ranges = max_ranges
        self._last_auto: Record | None = None

    def lost(self, slices: Slices) -> None:
        self._last_auto = None

    async def records(self, *, auto_mark: bool) -> AsyncIterator[Record]:
        while True:
            if auto_mark and self._last_auto is not None:
                self.mark_processed(self._last_auto)
                self._last_auto = None
            try:
                if (
                    self._status.stopped
                    or not self._fetcher.buffered
                    or not self._status.may_hand_out()
                ):
                    await self._fetcher.until_buffered(None)
                tp, record, hashed = self._fetcher.take_one()
            except ConsumerStopped:
                if self._status.stopped:
                    return
                raise
            self._handed.hand_out(tp, record.offset, hashed)
            if auto_mark:
                self._last_auto = record
            yield record

    async def getmany(
        self, timeout_ms: int, max_records: int | None
    ) -> dict[TopicPartition, list[Record]]:
        deadline = time.monotonic() + timeout_ms / 1000
        batch: dict[TopicPartition, list[Record]] = {}
        if not self._fetcher.buffered or not self._status.may_hand_out():
            try:
                await self._fetcher.until_buffered(deadline)
            except TimeoutError:
                return batch
        for tp, taken in self._fetcher.take_batch(max_records).items():
            self._handed.hand_out_batch(taken)
            # The caller gets a list of its own; ours records what was handed out.
            batch[tp] = list(taken.records)
        return batch

    def mark_all_processed(self, records: Iterable[Record]) -> None:
        batch = records if isinstance(records, list) else list(records)
        if not batch:
            return
        if self._handed.take_oldest_batch(batch, self._tracker.mark_head):
            return
        for record in batch:
            self.mark_processed(record)

    def mark_processed(self, record: Record) -> None:
        hashed = self._handed.take(record)
        if hashed is None:
            return
        # A plain tuple finds TopicPartition keys (a NamedTuple) and is cheaper to build.
        self._tracker.mark_processed((record.topic, record.partition), record.offset, hashed)
        if self._tracker.uncommitted_ranges >= self._max_ranges:
            self._committer.request()

    def still_owned(self, record: Record) -> bool:
        return self._status.may_hand_out() and self._handed.holds(record)
