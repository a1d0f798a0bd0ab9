"""Restoration of a task's key range from a store's changelog partition.

Every record of the changelog partition from the start offset to the high watermark (or to
``RestoreProgress.stop_at``, before which a source-topic table stops: see
``client.streams.restoring``) is fetched (the broker does not filter by key), and a record
whose key hash falls outside the task's ranges is skipped on its raw key bytes, before
anything is deserialized or written. The end is the high watermark the fetch itself reports
(never a ListOffsets call), so a restore is exact on every broker. One restorer per
process, apart from the main consumer, so restoration never holds up the fetch of tasks that
are processing.

The restorer sends its own fetch requests to the partition's leader and reads the record
batches as they arrived, rather than through a consumer: a consumer turns every record into
a ``ConsumerRecord`` first, which was most of a restore's time once the writes were batched
(a quarter of 200,000 records: 0.29 s through a consumer, 0.13 s this way), and it sends the
next fetch only once the last one is consumed, while this one asks for the next batches
before filtering and writing the current ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import aiokafka.errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from client.protocol.keyspace import (
    DIGEST_TOP_BYTE,
    KeyRange,
    digest_bounds,
    digest_in_ranges,
    digest_top_bytes,
    in_ranges,
    key_digest_bytes,
    key_hash,
)
from client.streams.errors import ChangelogOutOfRange, StreamsError
from client.streams.stores import BytesStore

_native: ModuleType | None
try:
    from client.protocol import _keyfilter as _native
except ImportError:  # installed without a C compiler: the Python loop judges every batch
    _native = None

logger = logging.getLogger(__name__)

# A fetch asks for no minimum of data, so Kafka answers at once even at the log end (a
# store whose checkpoint is current); some Kafka-protocol brokers still hold such a fetch
# for the wait, and answer nothing at all when it is 0.
_FETCH_WAIT_MS = 100
# Larger than a consumer's 1 MiB default: a restore reads a partition from end to end, and
# each round trip it saves is a wait the filtering cannot hide. Two fetches are in flight at
# most, so this bounds a restore's memory too.
_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
# The first fetch of a restore asks for this much, and each next one for twice the last, up
# to the cap: nothing hides the first answer's wait, and a broker took 15 ms to answer 6 MB
# against 2 ms for one 512 KiB batch. From then on the next, larger fetch is in flight while
# the current one is filtered, which takes longer than the broker's answer.
_FIRST_FETCH_BYTES = 512 * 1024
_READ_UNCOMMITTED = 0
# ListOffsets' timestamp that asks for a partition's first offset.
_EARLIEST = -2
_RETRY_BACKOFF_S = 0.1
# How long one fetch retries a retriable error (a leader election takes seconds) before the
# restore fails and is retried, with an ERROR, by the task restoring.
RETRIES_FOR_S = 30.0
# Changes written to the store at a time: one RocksDB write batch. Below the cyclic garbage
# collector's first-generation threshold (700 allocations net), so a batch is freed before
# the collector runs; a consumer's whole fetch held at once (100,000 records) made it run
# hundreds of times per restore.
_BATCH_RECORDS = 500
# Kafka's framing of a record batch, the same in every format: the base offset, then the
# length of the rest.
_LENGTH_AT = 8
_LOG_OVERHEAD = 12


@dataclass
class RestoreProgress:
    """What a restoration read and wrote; ``read`` counts every fetched record. ``failures``
    counts the attempts that failed, ``error`` says why the last one did until one succeeds.
    ``stop_at``: the restore ends before this offset rather than at the high watermark."""

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
    failures: int = 0
    error: str | None = None
    stop_at: int | None = None

    @property
    def fraction(self) -> float:
        if self.end_offset is None:
            return 0.0
        span = self.end_offset - self.start_offset
        return 1.0 if span <= 0 else min(1.0, (self.position - self.start_offset) / span)

    def figures(self) -> dict[str, Any]:
        """What ``StreamsApp.metrics()`` shows of the restoration."""
        return {
            "store": self.store,
            "read": self.read,
            "restored": self.restored,
            "fraction": round(self.fraction, 3),
            "done": self.done,
            "failures": self.failures,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class _Batch:
    """One record batch: its bytes, for the native judgement, and aiokafka's reading of it."""

    raw: memoryview
    records: Any


@dataclass(frozen=True, slots=True)
class _Fetched:
    """One fetch answer: the partition's high watermark and its complete data batches."""

    high_watermark: int
    batches: list[_Batch]
    next_offset: int


class Restorer:
    """Restores one (changelog partition, key ranges) at a time on a connection of its own.

    ``partition_fetch_bytes`` caps one fetch (the broker still answers with at least one
    record batch); the tests make it tiny to restore across many fetches."""

    def __init__(
        self,
        kafka_kwargs: dict[str, object],
        partition_fetch_bytes: int = _PARTITION_FETCH_BYTES,
        *,
        judge_in_c: bool = True,
    ) -> None:
        self._client = AIOKafkaClient(**kafka_kwargs)
        # False judges every batch in Python, as an install without a C compiler does: what
        # bench/streams.py measures the C filter against.
        self._judge_in_c = judge_in_c
        self._fetch_bytes = partition_fetch_bytes
        self._lock = asyncio.Lock()
        self._started = False

    @property
    def judges_in_c(self) -> bool:
        """Whether this restorer's restores judge keys with the C filter."""
        return self._judge_in_c and _native is not None

    async def start(self) -> None:
        if _native is None:
            logger.warning(
                "the restore's C key filter is not installed (client.protocol._keyfilter: "
                "keyrange was installed without a C compiler); restores judge keys in Python, "
                "about ten times slower per record fetched"
            )
        if not self._started:
            await self._client.bootstrap()
            self._started = True

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._client.close()

    async def restore(
        self,
        topic: str,
        progress: RestoreProgress,
        backend: BytesStore,
        on_progress: Callable[[RestoreProgress], None] = lambda _: None,
    ) -> RestoreProgress:
        tp = TopicPartition(topic, progress.partition)
        bounds = [(keys.start, keys.end) for keys in progress.ranges]
        async with self._lock:
            progress.position = progress.start_offset
            # The fetch after the one being filtered and written, when there is more to read.
            pending: asyncio.Future[_Fetched] | None = None
            fetch_bytes = min(_FIRST_FETCH_BYTES, self._fetch_bytes)
            try:
                while True:
                    fetched = await (pending or self._fetch(tp, progress.position, fetch_bytes))
                    pending = None
                    end = _end(fetched.high_watermark, progress.stop_at)
                    progress.end_offset = end
                    if fetched.next_offset < end:
                        fetch_bytes = min(2 * fetch_bytes, self._fetch_bytes)
                        pending = asyncio.ensure_future(
                            self._fetch(tp, fetched.next_offset, fetch_bytes)
                        )
                    for batch in fetched.batches:
                        if batch.records.base_offset >= end:
                            break
                        if batch.records.next_offset > end:
                            _judge_in_python(batch.records, progress, backend, end)
                        elif self._judge_in_c:
                            _restore_batch(batch, progress, bounds, backend, tp)
                        else:
                            _judge_in_python(batch.records, progress, backend)
                        progress.position = batch.records.next_offset
                        # The next answer arrives meanwhile: read off the socket between
                        # batches, the broker goes on sending instead of waiting on a full
                        # socket buffer until the whole fetch is filtered (0.085 -> 0.07 s
                        # for a restore that writes nothing).
                        await asyncio.sleep(0)
                    progress.position = min(max(progress.position, fetched.next_offset), end)
                    # Once per fetch: a changelog written in tiny batches would otherwise
                    # redraw a terminal's progress bar per record.
                    on_progress(progress)
                    if progress.position >= end:
                        break
            finally:
                if pending is not None:
                    pending.cancel()
        progress.seconds = time.monotonic() - progress.started
        progress.done = True
        on_progress(progress)
        return progress

    async def _fetch(self, tp: TopicPartition, offset: int, fetch_bytes: int) -> _Fetched:
        """One fetch from ``offset``, retried through leader moves and lost connections."""
        since = time.monotonic()
        while True:
            node = await self._leader(tp, since)
            request = FetchRequest(
                max_wait_time=_FETCH_WAIT_MS,
                min_bytes=0,
                max_bytes=fetch_bytes,
                isolation_level=_READ_UNCOMMITTED,
                topics=[(tp.topic, [(tp.partition, offset, fetch_bytes)])],
            )
            try:
                reply = await self._client.send(node, request)
            except kafka_errors.KafkaError as err:
                if not err.retriable:
                    raise StreamsError(f"cannot restore from {_name(tp)}: {err}") from err
                await self._retry_later(tp, str(err), since)
                continue
            error_code, high_watermark, records = _partition_reply(reply, tp)
            error = kafka_errors.for_code(error_code)
            if error is kafka_errors.NoError:
                return _batches(records, offset, high_watermark, tp)
            if error is kafka_errors.OffsetOutOfRangeError:
                # A consumer would jump to one end of the log and restore too little in
                # silence; the offset came from a checkpoint or from 0, so the changelog
                # lost records (retention, deleted records) or was created again. Kafka
                # answers this error without the log start, so it is asked for.
                log_start = await self.log_start(tp)
                raise ChangelogOutOfRange(tp.topic, tp.partition, offset, log_start)
            if not (error.retriable or error.invalid_metadata):
                raise StreamsError(f"cannot restore from {_name(tp)}: {error.message}")
            await self._retry_later(tp, error.message, since)

    async def log_start(self, tp: TopicPartition) -> int:
        """The partition's first offset (ListOffsets for the earliest), retried as a fetch."""
        since = time.monotonic()
        while True:
            node = await self._leader(tp, since)
            request = OffsetRequest(
                -1, _READ_UNCOMMITTED, [(tp.topic, [(tp.partition, _EARLIEST)])]
            )
            try:
                reply = await self._client.send(node, request)
            except kafka_errors.KafkaError as err:
                if not err.retriable:
                    raise StreamsError(f"cannot read the log start of {_name(tp)}: {err}") from err
                await self._retry_later(tp, str(err), since)
                continue
            error_code, offset = _listed_offset(reply, tp)
            error = kafka_errors.for_code(error_code)
            if error is kafka_errors.NoError:
                return offset
            if not (error.retriable or error.invalid_metadata):
                raise StreamsError(f"cannot read the log start of {_name(tp)}: {error.message}")
            await self._retry_later(tp, error.message, since)

    async def _leader(self, tp: TopicPartition, since: float) -> int:
        await self._client.add_topic(tp.topic)
        while True:
            leader = self._client.cluster.leader_for_partition(tp)
            if leader is not None and leader >= 0:
                return int(leader)
            await self._retry_later(tp, "no leader known", since)

    async def _retry_later(self, tp: TopicPartition, reason: str, since: float) -> None:
        """Wait out a retriable error; one lasting past ``RETRIES_FOR_S`` fails the restore,
        so the restoring task says why it waits (``client.streams.restoring``) instead of
        retrying in silence."""
        if time.monotonic() - since > RETRIES_FOR_S:
            raise StreamsError(
                f"cannot restore from {_name(tp)}: {reason}, for over {RETRIES_FOR_S:g} s"
            )
        logger.info("changelog fetch retried", extra={"partition": _name(tp), "reason": reason})
        await asyncio.sleep(_RETRY_BACKOFF_S)
        await self._client.force_metadata_update()


def _end(high_watermark: int, stop_at: int | None) -> int:
    return high_watermark if stop_at is None else min(high_watermark, stop_at)


def _partition_reply(reply: Any, tp: TopicPartition) -> tuple[int, int, bytes | None]:
    """(error code, high watermark, record bytes) of ``tp`` in a fetch answer; the record
    bytes come last in every version of the answer."""
    for topic, partitions in reply.topics:
        for partition_reply in partitions:
            if topic == tp.topic and partition_reply[0] == tp.partition:
                return partition_reply[1], partition_reply[2], partition_reply[-1]
    return kafka_errors.NotLeaderForPartitionError.errno, -1, None


def _listed_offset(reply: Any, tp: TopicPartition) -> tuple[int, int]:
    """(error code, offset) of ``tp`` in a ListOffsets answer: version 0 lists offsets, the
    later ones carry one after the timestamp."""
    for topic, partitions in reply.topics:
        for entry in partitions:
            if topic == tp.topic and entry[0] == tp.partition:
                if len(entry) > 3:
                    return entry[1], int(entry[3])
                return entry[1], int(entry[2][0]) if entry[2] else -1
    return kafka_errors.NotLeaderForPartitionError.errno, -1


def _batches(
    records: bytes | None, offset: int, high_watermark: int, tp: TopicPartition
) -> _Fetched:
    """The complete data batches of an answer, checksums checked (a trailing partial batch
    is fetched again); control batches only move the offset on. Every format frames a batch
    the same way, so the raw bytes of each batch aiokafka reads are cut alongside."""
    batches = []
    next_offset = offset
    raw = memoryview(records or b"")
    at = 0
    data = MemoryRecords(records) if records else None
    while data is not None and data.has_next():
        batch = data.next_batch()
        size = _LOG_OVERHEAD + int.from_bytes(raw[at + _LENGTH_AT : at + _LOG_OVERHEAD], "big")
        if not batch.validate_crc():
            raise StreamsError(f"cannot restore from {_name(tp)}: a corrupt batch at {offset}")
        if not batch.is_control_batch:
            batches.append(_Batch(raw[at : at + size], batch))
        at += size
        next_offset = batch.next_offset
    return _Fetched(high_watermark, batches, next_offset)


def _restore_batch(
    batch: _Batch,
    progress: RestoreProgress,
    bounds: list[tuple[int, int]],
    backend: BytesStore,
    tp: TopicPartition,
) -> None:
    """Write the batch's records from ``progress.position`` on (a fetch may start inside a
    batch) whose key hash falls in ``bounds``. Most records are other tasks', so judging them
    is what a restore's time goes to: the native judgement reads a skipped record without
    making a Python object of it (200,000 records judged in 0.003 s, against 0.035 s in
    Python); a batch it does not read (compressed), or an install without it, takes the
    Python loop."""
    if _native is not None:
        try:
            selected = _native.select(batch.raw, progress.position, bounds)
        except ValueError as err:
            raise StreamsError(f"cannot restore from {_name(tp)}: {err}") from err
        if selected is not None:
            read, keys, values = selected
            progress.read += read
            for first in range(0, len(keys), _BATCH_RECORDS):
                last = first + _BATCH_RECORDS
                _apply(
                    backend, list(zip(keys[first:last], values[first:last], strict=True)), progress
                )
            return
    _judge_in_python(batch.records, progress, backend)


def _judge_in_python(
    batch: Any, progress: RestoreProgress, backend: BytesStore, end: int | None = None
) -> None:
    """The same judgement on aiokafka's records, on the raw key bytes: each record is dropped
    as soon as it is judged (holding a few hundred at a time cost a third more), most keys
    are judged on one byte of their digest against the ranges' envelope
    (``digest_top_bytes``; ``key_hash`` as a call cost 0.07 s of 200,000 records, the
    digest's first half as an integer 0.04 s, this 0.035 s), and the writes go out a few
    hundred at a time. Records from ``end`` on are left (a batch across a restore's end)."""
    position = progress.position
    records = (
        batch if position <= batch.base_offset and end is None else _from(batch, position, end)
    )
    ranges = progress.ranges
    low_top, high_top = digest_top_bytes(
        *digest_bounds(min(keys.start for keys in ranges), max(keys.end for keys in ranges))
    )
    exact = len(ranges) == 1
    digest = key_digest_bytes
    top_byte = DIGEST_TOP_BYTE
    read = 0
    changes: list[tuple[bytes, bytes | None]] = []
    for read, record in enumerate(records, 1):  # noqa: B007 (the count, read after the loop)
        key = record.key
        if key is None:
            if not in_ranges(ranges, key_hash(None, record.offset)):
                continue
        else:
            hashed = digest(key, 0)
            top = hashed[top_byte]
            if low_top < top < high_top:
                if not exact and not digest_in_ranges(ranges, hashed):
                    continue
            elif not (low_top <= top <= high_top and digest_in_ranges(ranges, hashed)):
                continue
        changes.append((key, record.value))
        if len(changes) == _BATCH_RECORDS:
            _apply(backend, changes, progress)
            changes = []
    _apply(backend, changes, progress)
    progress.read += read


def _from(batch: Any, position: int, end: int | None) -> Iterator[Any]:
    if end is None:
        return (record for record in batch if record.offset >= position)
    return (record for record in batch if position <= record.offset < end)


def _apply(
    backend: BytesStore, changes: list[tuple[bytes, bytes | None]], progress: RestoreProgress
) -> None:
    if changes:
        backend.apply(changes)
        progress.restored += len(changes)


def _name(tp: TopicPartition) -> str:
    return f"changelog {tp.topic}[{tp.partition}]"
