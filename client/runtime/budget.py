"""The byte budget: bytes taken in and not finished, per partition. The intake charges a
record's weight when it takes the record from the consumer; the runtime refunds it when the
record is finished, given back or dropped. A partition over its share of the bound has its
fetching paused, and resumed once it is back under ``resume_ratio`` of the share; heartbeats
and commits do not go through the fetch, so they keep flowing while paused.

The worker's ``max_buffered_bytes`` (kafka-workers' ``queue.total.size.heap.ratio`` and
``queue.resume.ratio``) and the streams runtime's ``max_buffered_bytes`` (Kafka Streams'
``input.buffer.max.bytes``, KIP-770) are this one budget. Pure but for naming a partition:
it does no I/O itself, the pause and resume are handed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from aiokafka.structs import TopicPartition

logger = logging.getLogger(__name__)

Switch = Callable[[list[TopicPartition]], None]

# What a buffered record costs besides its key and value: the record object, its place in
# the runtime's queues and the offset bookkeeping. Counted so a bound in bytes bounds memory,
# not just payload, for small records too.
RECORD_OVERHEAD_BYTES = 400


class Weighed(Protocol):
    """What a record's weight is read from (aiokafka's ``ConsumerRecord`` has both)."""

    @property
    def serialized_key_size(self) -> int: ...

    @property
    def serialized_value_size(self) -> int: ...


def weight(record: Weighed) -> int:
    """A record's charge: its key and value as stored (-1 when absent) plus the overhead.
    Comparisons, not ``max()``: asked twice per record, and the two calls made it three
    times slower (0.42 against 0.13 us)."""
    key, value = record.serialized_key_size, record.serialized_value_size
    return (key if key > 0 else 0) + (value if value > 0 else 0) + RECORD_OVERHEAD_BYTES


class ByteBudget:
    """Each owned partition may hold ``bound / owned partitions`` bytes, so the total stays
    within the bound (plus the fetch that crossed it) however the records spread.

    ``max_records``, when given, also pauses a partition holding that many records and keeps
    it paused until it is down to ``resume_ratio`` of them: the streams runtime's deprecated
    ``max_buffered_records``, honoured beside the bytes as Kafka Streams honoured
    ``buffered.records.per.partition`` beside ``input.buffer.max.bytes``."""

    def __init__(
        self,
        bound: int,
        resume_ratio: float,
        pause: Switch,
        resume: Switch,
        *,
        max_records: int | None = None,
    ) -> None:
        self._bound = bound
        self._resume_ratio = resume_ratio
        self._pause = pause
        self._resume = resume
        self._max_records = max_records
        self._bytes: dict[TopicPartition, int] = {}
        self._records: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._partitions = 1
        # How many times a partition was paused, for metrics and tests.
        self.pauses = 0

    @property
    def total(self) -> int:
        return sum(self._bytes.values())

    @property
    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(self._paused)

    def set_partitions(self, count: int) -> None:
        """The partitions owned now share the bound: a new share may resume a paused one."""
        self._partitions = max(count, 1)
        for tp in list(self._paused):
            self._check(tp)

    def charge(self, tp: TopicPartition, count: int) -> None:
        """A record of ``count`` bytes was taken in from ``tp``."""
        total = self._bytes[tp] = self._bytes.get(tp, 0) + count
        over = total > self._share()
        if self._max_records is not None:
            records = self._records[tp] = self._records.get(tp, 0) + 1
            over = over or records >= self._max_records
        if not over:
            return
        # Paused again even when it already was: a reassignment of the partitions (a slice
        # added or revoked) resumes them all in the Kafka consumer.
        self._pause([tp])
        if tp not in self._paused:
            self._paused.add(tp)
            self.pauses += 1
            logger.info(
                "fetching paused: buffered records over the bound",
                extra={"topic": tp.topic, "partition": tp.partition, "buffered_bytes": total},
            )

    def refund(self, tp: TopicPartition, count: int, records: int = 1) -> None:
        """``records`` records of ``count`` bytes of ``tp`` together were finished, given
        back or dropped."""
        total = self._bytes.get(tp, 0) - count
        if total > 0:
            self._bytes[tp] = total
        else:
            self._bytes.pop(tp, None)
        if self._max_records is not None:
            left = self._records.get(tp, 0) - records
            if left > 0:
                self._records[tp] = left
            else:
                self._records.pop(tp, None)
        if tp in self._paused:
            self._check(tp)

    def _share(self) -> float:
        return self._bound / self._partitions

    def _check(self, tp: TopicPartition) -> None:
        if self._bytes.get(tp, 0) > self._share() * self._resume_ratio:
            return
        if (
            self._max_records is not None
            and self._records.get(tp, 0) > self._max_records * self._resume_ratio
        ):
            return
        self._paused.discard(tp)
        self._resume([tp])
        logger.info("fetching resumed", extra={"topic": tp.topic, "partition": tp.partition})
