"""The raw filter: a member's key ranges judged on the fetched record batches, before aiokafka
builds a record of them (docs/architecture.md, "The raw filter").

A member owning a part of a partition's key space fetches every record of the partition, and
aiokafka's consumer makes a Python record of each before Keyrange could drop the ones of other
members: the member's CPU was set by the partition's traffic, not by its share. Here each
batch of a fetch answer is judged as it is unpacked: a record outside the member's ranges, or
below where its slice reads from (what the slice saw already, or what a committed watermark
covers), costs its varints and its hash in C (``client.protocol._keyfilter.scan``), and only
the records kept are built, as the very ``ConsumerRecord`` objects aiokafka builds.

Everything else is aiokafka's own code: ``install`` runs the consumer fetcher's
``_proc_fetch_request`` (fetch answers, positions, high watermarks, errors) unchanged, with its
two names ``MemoryRecords`` and ``PartitionRecords`` bound to ``RawRecords``, which keeps the
answer's bytes, and ``FilteredRecords``, which is aiokafka's ``PartitionRecords`` (CRC checks,
control batches, aborted transactions under ``read_committed``) but for the step that reads a
batch's records. That step yields one ``Judged`` per batch instead of one record per record.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import aiokafka.consumer.fetcher as aiokafka_fetcher
from aiokafka import AIOKafkaConsumer
from aiokafka.codec import (
    gzip_decode,
    has_lz4,
    has_snappy,
    has_zstd,
    lz4_decode,
    snappy_decode,
    zstd_decode,
)
from aiokafka.errors import CorruptRecordException
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition

from client.protocol.keyspace import key_hash

try:
    from client.protocol import _keyfilter as native
except ImportError:  # installed without a C compiler: every batch is judged in Python
    native = None  # type: ignore[assignment]

# (hash start, hash end, first offset kept) of a partition's active slices.
Bounds = list[tuple[int, int, int]]
Deserializer = Callable[[bytes], Any]

# Kafka's framing of a record batch, the same in every format: the base offset, then the
# length of the rest; a v2 batch's records start after its 61-byte header.
_LENGTH_AT = 8
_LOG_OVERHEAD = 12
_V2_HEADER = 61
_MAGIC_AT = 16

# aiokafka's v2 codecs, by the batch's compression type, with whether their library is here.
_CODECS: dict[int, tuple[Callable[[], bool], Callable[[bytes], bytes]]] = {
    1: (lambda: True, gzip_decode),
    2: (has_snappy, snappy_decode),
    3: (has_lz4, lz4_decode),
    4: (has_zstd, zstd_decode),
}


# The order in which the C scan gives a record's fields (ConsumerRecord's constructor's).
_FIELD_ORDER = (
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestamp_type",
    "key",
    "value",
    "checksum",
    "serialized_key_size",
    "serialized_value_size",
    "headers",
)


def _settable_fields() -> tuple[str, ...] | None:
    """``ConsumerRecord``'s field names when its ``__init__`` does nothing but set them (a
    plain dataclass, as in every aiokafka this runs on): the C scan then sets them on a new
    instance itself, which halves what building a kept record costs. None otherwise, and the
    C scan calls the class."""
    params = getattr(ConsumerRecord, "__dataclass_params__", None)
    if (
        params is None
        or params.frozen
        or not params.init
        or hasattr(ConsumerRecord, "__post_init__")
        or "__slots__" in vars(ConsumerRecord)
        or tuple(field.name for field in dataclasses.fields(ConsumerRecord)) != _FIELD_ORDER
    ):
        return None
    return _FIELD_ORDER


_FIELDS = _settable_fields()


@dataclasses.dataclass(frozen=True, slots=True)
class Judged:
    """One batch judged: the records kept with their offsets and key hashes, and the offset
    after the batch (every record below it was judged)."""

    records: list[Any]
    offsets: list[int]
    hashes: list[int]
    next_offset: int


class RawFilter:
    """Judges a partition's batches against ``bounds_of(tp)`` at the moment they are unpacked
    (in a ``getmany`` call, under the fetcher's lock, so the slices cannot change meanwhile).
    ``in_c=False`` judges in Python, as an install without the C extension does."""

    def __init__(
        self,
        bounds_of: Callable[[TopicPartition], Bounds],
        *,
        key_deserializer: Deserializer | None,
        value_deserializer: Deserializer | None,
        in_c: bool = True,
    ) -> None:
        self._bounds_of = bounds_of
        self._key_decode = key_deserializer
        self._value_decode = value_deserializer
        self.in_c = in_c and native_available()

    def judge(self, tp: TopicPartition, raw: memoryview, batch: Any, position: int) -> Judged:
        """The records of ``batch`` (its bytes ``raw``) from ``position`` on that the
        partition's slices take."""
        bounds = self._bounds_of(tp)
        if not bounds:
            return Judged([], [], [], batch.next_offset)
        if self.in_c and raw[_MAGIC_AT] == 2:
            scanned = self._scan(tp, raw, batch, position, bounds)
            if scanned is not None:
                return Judged(*scanned, batch.next_offset)
        return Judged(*self._in_python(tp, batch, position, bounds), batch.next_offset)

    def _scan(
        self, tp: TopicPartition, raw: memoryview, batch: Any, position: int, bounds: Bounds
    ) -> tuple[list[Any], list[int], list[int]] | None:
        body: bytes | None = None
        codec = batch.compression_type
        if codec:
            available, decode = _CODECS.get(codec, (lambda: False, gzip_decode))
            if not available():
                return None  # aiokafka's own reading raises its error for a missing codec
            body = decode(raw[_V2_HEADER:].tobytes())
        try:
            return native.scan(
                raw,
                body,
                position,
                bounds,
                ConsumerRecord,
                _FIELDS,
                tp.topic,
                tp.partition,
                self._key_decode,
                self._value_decode,
            )
        except native.MalformedBatch as err:
            raise CorruptRecordException(f"{err} in {tp.topic}[{tp.partition}]") from err

    def _in_python(
        self, tp: TopicPartition, batch: Any, position: int, bounds: Bounds
    ) -> tuple[list[Any], list[int], list[int]]:
        """The same judgement on aiokafka's reading of the batch (every format it reads)."""
        key_decode, value_decode = self._key_decode, self._value_decode
        topic, partition = tp.topic, tp.partition
        records: list[Any] = []
        offsets: list[int] = []
        hashes: list[int] = []
        for record in batch:
            offset = record.offset
            if offset < position:
                continue
            key, value = record.key, record.value
            hashed = key_hash(key, offset)
            if not any(start <= hashed <= end and offset >= first for start, end, first in bounds):
                continue
            records.append(
                ConsumerRecord(
                    topic,
                    partition,
                    offset,
                    record.timestamp,
                    record.timestamp_type,
                    key if key is None or key_decode is None else key_decode(key),
                    value if value is None or value_decode is None else value_decode(value),
                    record.checksum,
                    -1 if key is None else len(key),
                    -1 if value is None else len(value),
                    tuple(record.headers),
                )
            )
            offsets.append(offset)
            hashes.append(hashed)
        return records, offsets, hashes


def native_available() -> bool:
    return native is not None


class RawRecords:
    """aiokafka's ``MemoryRecords`` of a fetch answer, with the answer's bytes kept."""

    __slots__ = ("_records", "raw")

    def __init__(self, data: bytes) -> None:
        self.raw = memoryview(data)
        self._records = MemoryRecords(data)

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        return self._records.next_batch()

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())


class FilteredRecords(aiokafka_fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's ``PartitionRecords`` with each data batch judged by a ``RawFilter``: what
    aiokafka skips (control batches, aborted transactions, records below the fetch offset)
    is skipped alike, and ``next_fetch_offset`` ends where aiokafka's would."""

    def __init__(self, raw_filter: RawFilter, *args: Any) -> None:
        self._filter = raw_filter
        super().__init__(*args)

    def _unpack_records(self) -> Iterator[Judged]:
        # aiokafka's loop (consumer/fetcher.py, PartitionRecords._unpack_records), but for
        # the judgement of a data batch's records.
        tp = self._tp
        records: RawRecords = self._records
        raw = records.raw
        at = 0
        while records.has_next():
            batch = records.next_batch()
            size = _LOG_OVERHEAD + int.from_bytes(raw[at + _LENGTH_AT : at + _LOG_OVERHEAD], "big")
            batch_raw = raw[at : at + size]
            at += size
            if self._check_crcs and not batch.validate_crc():
                raise CorruptRecordException(f"Invalid CRC - {tp}")
            if (
                self._isolation_level == aiokafka_fetcher.READ_COMMITTED
                and batch.producer_id is not None
            ):
                self._consume_aborted_up_to(batch.base_offset)
                if batch.is_control_batch and self._contains_abort_marker(batch):
                    self._aborted_producers.discard(batch.producer_id)
                if batch.is_transactional and batch.producer_id in self._aborted_producers:
                    self.next_fetch_offset = batch.next_offset
                    yield Judged([], [], [], batch.next_offset)
                    continue
            if batch.is_control_batch:
                self.next_fetch_offset = batch.next_offset
                yield Judged([], [], [], batch.next_offset)
                continue
            judged = self._filter.judge(tp, batch_raw, batch, self.next_fetch_offset)
            self.next_fetch_offset = batch.next_offset
            yield judged


_REBOUND = ("MemoryRecords", "PartitionRecords")


def install(kafka: AIOKafkaConsumer, raw_filter: RawFilter) -> None:
    """Make the started ``kafka`` hand out ``Judged`` batches instead of records: its fetcher
    runs aiokafka's own fetch-answer code, rebound to ``RawRecords`` and ``FilteredRecords``.
    No other consumer is touched (nothing of aiokafka's modules is replaced)."""
    method = aiokafka_fetcher.Fetcher._proc_fetch_request
    code = method.__code__
    missing = [name for name in _REBOUND if name not in code.co_names]
    if missing:
        raise RuntimeError(
            f"this aiokafka's fetcher does not build {missing} where Keyrange expects: "
            "the raw filter cannot be installed"
        )
    namespace = dict(vars(aiokafka_fetcher))
    namespace["MemoryRecords"] = RawRecords
    namespace["PartitionRecords"] = functools.partial(FilteredRecords, raw_filter)
    rebound = types.FunctionType(code, namespace, code.co_name, method.__defaults__)
    # aiokafka's fetcher is private to its consumer; it looks the method up on every fetch.
    fetcher = kafka._fetcher
    fetcher._proc_fetch_request = types.MethodType(rebound, fetcher)
