"""Kafka I/O for the Spark source: partition discovery, log ends, and reading one slice.

The log end is the high watermark carried by a fetch response, never ListOffsets
("latest"): it is what the broker serves to readers at that moment, and some
Kafka-protocol brokers answer ListOffsets inexactly. Executors are synchronous Python, so
``read_slice`` drives its own event loop around an aiokafka consumer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from client.kafka_stop import stop_consumer
from client.spark.kafka_settings import KafkaSettings
from client.spark.options import Subscription
from client.spark.planning import Slice
from client.spark.topic_pattern import matching_topics

logger = logging.getLogger(__name__)

# One poll waits this long for records before checking whether the slice is complete;
# short enough that the end of a slice is noticed quickly, long enough not to spin.
_POLL_TIMEOUT_MS = 500
# Records per chunk handed to Spark: large enough to amortise Arrow conversion, small
# enough to keep a task's memory flat.
_CHUNK_RECORDS = 10_000
# Bytes per partition per fetch: large fetches amortise the per-request cost, which
# dominates reading small records in Python.
_FETCH_BYTES = 8 * 1024 * 1024


def _consumer(
    bootstrap: str, settings: KafkaSettings, overrides: Mapping[str, Any] | None = None
) -> AIOKafkaConsumer:
    arguments: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "group_id": None,
        "enable_auto_commit": False,
        "max_partition_fetch_bytes": _FETCH_BYTES,
        "fetch_max_bytes": 4 * _FETCH_BYTES,
    }
    arguments.update(overrides or {})
    arguments.update(settings.client_arguments())
    return AIOKafkaConsumer(**arguments)


async def _consumer_at(
    bootstrap: str, settings: KafkaSettings, tp: TopicPartition, offset: int
) -> AIOKafkaConsumer:
    # aiokafka binds a consumer and its assignment to the event loop running at creation.
    # "none": a start below the log start means records were deleted under us; failing
    # the task is better than silently skipping them (planning already clamps to the
    # log start, so this only fires when retention races a running job).
    consumer = _consumer(bootstrap, settings, {"auto_offset_reset": "none"})
    await consumer.start()
    consumer.assign([tp])
    consumer.seek(tp, offset)
    return consumer


class UnsupportedLookup(LookupError):
    """The broker does not answer a lookup the read needs (offsets by timestamp)."""


class ClusterView:
    """A short-lived consumer for planning: which partitions exist and where their logs end."""

    def __init__(self, bootstrap: str, settings: KafkaSettings) -> None:
        # One byte per partition: a fetch still returns the first record batch (KIP-74), and
        # only its high watermark is wanted, not a prefetch of the log.
        self._consumer = _consumer(
            bootstrap,
            settings,
            {"max_partition_fetch_bytes": 1, "auto_offset_reset": "earliest"},
        )
        self._read_committed = settings.read_committed

    async def __aenter__(self) -> ClusterView:
        await self._consumer.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await stop_consumer(self._consumer)

    async def partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The partitions a subscription covers now (a pattern sees topics created since)."""
        existing = await self._consumer.topics()
        if subscription.pattern is not None:
            topics: Iterable[str] = sorted(matching_topics(subscription.pattern, existing))
        else:
            topics = subscription.topics or sorted({tp.topic for tp in subscription.assign})
        result = []
        for topic in topics:
            if topic not in existing:
                raise LookupError(f"topic {topic!r} does not exist in the Kafka cluster")
            for partition in sorted(self._consumer.partitions_for_topic(topic) or ()):
                result.append(TopicPartition(topic, partition))
        if subscription.assign:
            missing = sorted(set(subscription.assign) - set(result))
            if missing:
                raise LookupError(f"assigned partitions {missing} do not exist in the cluster")
            return list(subscription.assign)
        return result

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        """The first offset whose record timestamp is at or after the given one (ms); None
        where no record is.

        The broker's answer is checked against the record it names: some Kafka-protocol
        brokers answer ListOffsets by timestamp with an offset regardless of the timestamp,
        and reading from there would silently read the wrong records.
        """
        if not timestamps:
            return {}
        found = await self._consumer.offsets_for_times(dict(timestamps))
        offsets = {tp: None if hit is None else int(hit.offset) for tp, hit in found.items()}
        for tp, offset in offsets.items():
            if offset is None:
                continue
            stamp = await self._timestamp_at(tp, offset)
            if stamp is not None and stamp < timestamps[tp]:
                raise UnsupportedLookup(
                    f"the broker answered offsets by timestamp for {tp.topic}[{tp.partition}] "
                    f"with offset {offset}, whose record is stamped {stamp}, before the "
                    f"requested {timestamps[tp]}: it does not answer ListOffsets by timestamp"
                )
        return offsets

    async def _timestamp_at(self, tp: TopicPartition, offset: int) -> int | None:
        consumer = self._consumer
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            fetched = await consumer.getmany(tp, timeout_ms=200, max_records=1)
            for record in fetched.get(tp, ()):
                return int(record.timestamp)
            end = self._log_end(tp)
            if end is not None and end <= offset:
                return None
        raise TimeoutError(f"no record of {tp.topic}[{tp.partition}] at offset {offset} in 30s")

    async def earliest(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        offsets = await self._consumer.beginning_offsets(list(partitions))
        return {tp: int(offset) for tp, offset in offsets.items()}

    async def latest(
        self, positions: Mapping[TopicPartition, int], timeout_s: float = 30.0
    ) -> dict[TopicPartition, int]:
        """High watermark (or last stable offset under read_committed) of each partition.

        Fetching from a known position (the previous batch end) keeps each response small;
        a position outside the log is reset to its start, which still yields the watermark.
        """
        if not positions:
            return {}
        consumer = self._consumer
        consumer.assign(list(positions))
        for tp, offset in positions.items():
            consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while True:
            ends = {tp: self._log_end(tp) for tp in positions}
            if all(end is not None for end in ends.values()):
                return {tp: int(end) for tp, end in ends.items() if end is not None}
            if time.monotonic() > deadline:
                missing = sorted(tp for tp, end in ends.items() if end is None)
                raise TimeoutError(f"no fetch response carried the high watermark of {missing}")
            await consumer.getmany(timeout_ms=100, max_records=1)

    def _log_end(self, tp: TopicPartition) -> int | None:
        if self._read_committed:
            return self._consumer.last_stable_offset(tp)  # type: ignore[no-any-return]
        return self._consumer.highwater(tp)  # type: ignore[no-any-return]


def read_slice(
    piece: Slice, bootstrap: str, settings: KafkaSettings, stall_timeout_s: float
) -> Iterator[list[ConsumerRecord[bytes, bytes]]]:
    """Chunks of the records of ``[piece.start, piece.end)``, in offset order, unfiltered.

    A slice whose reader makes no progress for ``stall_timeout_s`` (Spark's
    ``kafkaConsumer.pollTimeoutMs``) fails its task, which Spark retries, rather than
    hanging: the records it expects were promised by the high watermark.
    """
    if piece.start >= piece.end:
        return
    loop = asyncio.new_event_loop()
    tp = piece.topic_partition
    consumer = loop.run_until_complete(_consumer_at(bootstrap, settings, tp, piece.start))
    try:
        next_offset = piece.start
        last_progress = time.monotonic()
        while next_offset < piece.end:
            # Records are decoded as they are taken from the fetch buffer: taking no more
            # than the slice still needs leaves the prefetched rest of the log undecoded.
            wanted = min(piece.end - next_offset, _CHUNK_RECORDS)
            fetched = loop.run_until_complete(
                consumer.getmany(tp, timeout_ms=_POLL_TIMEOUT_MS, max_records=wanted)
            )
            records = [r for r in fetched.get(tp, ()) if r.offset < piece.end]
            if records:
                yield records
            position = loop.run_until_complete(consumer.position(tp))
            if position > next_offset:
                next_offset = position
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout_s:
                raise TimeoutError(
                    f"reading {tp.topic}/{tp.partition} stalled at offset {next_offset}, "
                    f"below the slice end {piece.end}"
                )
    finally:
        loop.run_until_complete(stop_consumer(consumer))
        loop.close()
