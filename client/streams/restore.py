"""Restoration of a task's key range from a store's changelog partition.

Every record of the changelog partition from the start offset to the high watermark is
fetched (the broker does not filter by key), and a record whose key hash falls outside the
task's ranges is skipped on its raw key bytes, before anything is deserialized or written.
The end is the high watermark the fetch itself reports (never a ListOffsets call), so a
restore is exact on every broker. One restore consumer per process, apart from the main
consumer, so restoration never holds up the fetch of tasks that are processing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from client.kafka_stop import stop_consumer
from client.protocol.keyspace import KeyRange, hash_records
from client.streams.stores import BytesStore

# A fetch wait short enough that the end of an empty or idle changelog is seen quickly.
_FETCH_WAIT_MS = 100
# Records taken per getmany. A whole fetch handed over at once (100,000 records on a fast
# broker) kept that many records alive while they were filtered and written, so the cyclic
# garbage collector ran hundreds of times per restore and promoted them into its older
# generations: more than half of a bare fetch's time. Batches below the collector's
# first-generation threshold (700 allocations net) are freed before it ever triggers.
_BATCH_RECORDS = 500


@dataclass
class RestoreProgress:
    """What a restoration read and wrote; ``read`` counts every fetched record."""

    store: str
    partition: int
    ranges: list[KeyRange]
    start_offset: int
    end_offset: int | None = None
    position: int = 0
    read: int = 0
    restored: int = 0
    seconds: float = 0.0
    done: bool = False
    started: float = field(default_factory=time.monotonic)

    @property
    def fraction(self) -> float:
        if self.end_offset is None:
            return 0.0
        span = self.end_offset - self.start_offset
        return 1.0 if span <= 0 else min(1.0, (self.position - self.start_offset) / span)


class Restorer:
    """Restores one (changelog partition, key ranges) at a time on a consumer of its own."""

    def __init__(self, kafka_kwargs: dict[str, object]) -> None:
        self._consumer = AIOKafkaConsumer(enable_auto_commit=False, **kafka_kwargs)
        self._lock = asyncio.Lock()
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await self._consumer.start()
            self._started = True

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await stop_consumer(self._consumer)

    async def restore(
        self,
        topic: str,
        progress: RestoreProgress,
        engine: BytesStore,
        on_progress: Callable[[RestoreProgress], None] = lambda _: None,
    ) -> RestoreProgress:
        tp = TopicPartition(topic, progress.partition)
        bounds = [(keys.start, keys.end) for keys in progress.ranges]
        async with self._lock:
            self._consumer.assign([tp])
            self._consumer.seek(tp, progress.start_offset)
            progress.position = progress.start_offset
            while True:
                batch = await self._consumer.getmany(
                    tp, timeout_ms=_FETCH_WAIT_MS, max_records=_BATCH_RECORDS
                )
                records = batch.get(tp, [])
                progress.read += len(records)
                mine = _inside(records, bounds)
                progress.restored += len(mine)
                for record in mine:
                    if record.value is None:
                        engine.delete(record.key)
                    else:
                        engine.put(record.key, record.value)
                progress.position = await self._consumer.position(tp)
                progress.end_offset = self._consumer.highwater(tp)
                on_progress(progress)
                if progress.end_offset is not None and progress.position >= progress.end_offset:
                    break
            # Nothing more is fetched until the next restoration assigns its partition.
            self._consumer.pause(tp)
        progress.seconds = time.monotonic() - progress.started
        progress.done = True
        on_progress(progress)
        return progress


def _inside(records: list[Any], bounds: list[tuple[int, int]]) -> list[Any]:
    """The records whose key hash falls in ``bounds``, judged on the raw key bytes. Most
    records of a partition are other tasks', so this skip is what a restore's time goes to:
    the hashes of a whole fetch in one call, and one comparison for the usual single range."""
    hashes = hash_records(records)
    if len(bounds) == 1:
        low, high = bounds[0]
        return [
            record for record, hashed in zip(records, hashes, strict=True) if low <= hashed <= high
        ]
    return [
        record
        for record, hashed in zip(records, hashes, strict=True)
        if any(low <= hashed <= high for low, high in bounds)
    ]
