"""Record timestamps read from Kafka for the age of each partition's oldest unprocessed
record (coordinator/record_age.py): the first record at or after an offset, one fetch per
partition.

One fetch per partition, not one per leader: Kafka returns a batch larger than the fetch's
byte cap only for the first partition of a request, so a request for many partitions with a
small cap would leave most of them empty, and a large cap would carry up to a megabyte per
partition. With the cap at one byte each fetch returns one record batch, the one holding the
offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import aiokafka.errors as kafka_errors
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords

from coordinator.kafka import ClusterMetadata, TopicPartition

# As coordinator/kafka.py's watermark fetch: answered at once at the log end.
_FETCH_MAX_WAIT_MS = 10
_FETCH_MAX_BYTES = 1
_READ_UNCOMMITTED = 0

Position = tuple[TopicPartition, int]


class RecordTimestamps:
    def __init__(self, cluster: ClusterMetadata) -> None:
        self._connection = cluster.connection

    async def first_at(self, positions: Iterable[Position]) -> dict[Position, int]:
        """Per position (partition, offset), the timestamp (ms) of the first record at or
        after it; absent where there is none yet (the offset is the log end), or the
        partition has no leader or did not answer."""
        wanted = sorted(set(positions))
        if not wanted:
            return {}
        async with self._connection.bounded("reading record timestamps"):
            layout = await self._connection.layout(sorted({topic for (topic, _), _ in wanted}))
            reads = [
                self._first_at(leader, tp, offset)
                for tp, offset in wanted
                if (leader := layout.leaders.get(tp)) is not None and leader >= 0
            ]
            found = await asyncio.gather(*reads)
        return {position: timestamp for position, timestamp in found if timestamp is not None}

    async def _first_at(
        self, node: int, tp: TopicPartition, offset: int
    ) -> tuple[Position, int | None]:
        topic, partition = tp
        request = FetchRequest(
            max_wait_time=_FETCH_MAX_WAIT_MS,
            min_bytes=0,
            max_bytes=_FETCH_MAX_BYTES,
            isolation_level=_READ_UNCOMMITTED,
            topics=[(topic, [(partition, offset, _FETCH_MAX_BYTES)])],
        )
        try:
            reply = await self._connection.send(node, request)
        except kafka_errors.KafkaError as err:
            if not err.retriable:
                raise
            return (tp, offset), None
        for _, partition_replies in reply.topics:
            for answer in partition_replies:
                # (partition, error code, high watermark, ..., records) in every version.
                if answer[0] == partition and answer[1] == 0 and answer[-1]:
                    return (tp, offset), _first_timestamp(answer[-1], offset)
        return (tp, offset), None


def _first_timestamp(data: bytes, offset: int) -> int | None:
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        if getattr(batch, "is_control_batch", False):
            continue
        for record in batch:
            if record.offset >= offset:
                return int(record.timestamp)
    return None
