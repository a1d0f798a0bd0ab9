"""The one implementation of the seams a runtime drives the consumer through
(``client.runtime.seams``: ``run()``'s dispatcher, ``client.worker``, ``client.streams``):
what to hand out next, marking, giving back, pausing, and the partition ends and slice
watermarks that metrics read.

Built by the consumer from its parts (``KeyrangeConsumer.drive``), so it needs nothing of the
consumer's front and the front's module and this one do not import each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from aiokafka.structs import TopicPartition

from client.fetcher import Fetcher, Item, Record
from client.handout import HandedOut
from client.protocol.keyspace import KeyRange
from client.runtime.gate import Lease, OwnershipGate
from client.status import ConsumerStatus
from client.tracker import OffsetTracker


class ConsumerSource:
    """The seams a runtime uses (``WorkerSource``, which includes ``RecordSource``), over the
    consumer's parts."""

    def __init__(
        self,
        fetcher: Fetcher,
        handed: HandedOut,
        tracker: OffsetTracker,
        gate: OwnershipGate,
        status: ConsumerStatus,
        *,
        mark_processed: Callable[[Record], None],
    ) -> None:
        self._fetcher = fetcher
        self._handed = handed
        self._tracker = tracker
        self._status = status
        self.gate = gate
        self.may_hand_out = status.may_hand_out
        self.session_deadline = status.session_deadline
        self.mark_processed = mark_processed

    @property
    def stopped(self) -> bool:
        return self._status.stopped

    async def next_item(self, interrupt: asyncio.Future[None]) -> Item:
        return await self._fetcher.next_item(None, interrupt)

    def hand_out(self, tp: TopicPartition, record: Record, hashed: int) -> Lease | None:
        """Record ``record`` as with user code; the lease it may start under (the gate's)."""
        self._handed.hand_out(tp, record.offset, hashed)
        return self.gate.lease(tp, hashed)

    def give_back(self, record: Record) -> None:
        """No longer with user code and not processed: a revocation stops waiting for it and
        the slice's next owner (or this member, after a restart) gets it again."""
        self._handed.take(record)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        kafka = self._fetcher.kafka()
        assigned = kafka.assignment()
        kafka.pause(*[tp for tp in partitions if tp in assigned])

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        kafka = self._fetcher.kafka()
        assigned = kafka.assignment()
        kafka.resume(*[tp for tp in partitions if tp in assigned])

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's end as the last fetch saw it (never ListOffsets: exact)."""
        highwater: int | None = self._fetcher.kafka().highwater(tp)
        return highwater

    def slice_watermarks(self) -> list[tuple[TopicPartition, KeyRange, int]]:
        """Each active slice with its lowest offset not processed yet (its commit point)."""
        tracker = self._tracker
        return [
            (tp, progress.keys, progress.watermark)
            for tp in tracker.partitions()
            for progress in tracker.slices_of(tp)
            if progress.active
        ]

    def slice_starts(self, tp: TopicPartition, keys: KeyRange) -> list[tuple[KeyRange, int]]:
        """Where processing of each part of ``keys`` on ``tp`` starts (``SliceProgress.starts``),
        over the active slices; empty where none holds them."""
        return [
            start
            for progress in self._tracker.slices_of(tp)
            if progress.active
            for start in progress.starts(keys)
        ]
