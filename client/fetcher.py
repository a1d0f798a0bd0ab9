"""Fetching and key filtering: one ``AIOKafkaConsumer`` in manual-assignment mode, read for the
partitions of the slices held, and a buffer of the fetched records whose key hash falls in an
active slice and that the group has not processed yet, in fetch order.

The hand-out guard (``may_hand_out``, the membership's session deadline) is asked before a
poll's records are buffered and before ``until_buffered`` says a record is ready, so nothing
fetched for slices that were just lost reaches the buffer or leaves it.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from itertools import compress
from typing import Any, Protocol, TypeAlias

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import OffsetOutOfRangeError
from aiokafka.structs import TopicPartition

from client.errors import ConsumerStopped
from client.http import Slices
from client.kafka_stop import stop_consumer
from client.protocol.keyspace import HASH_MAX, HASH_MIN, hash_records, in_ranges
from client.protocol.log_bounds import out_of_range
from client.tracker import OffsetTracker, SliceProgress

# aiokafka ships no type information; at runtime this is ``aiokafka.structs.ConsumerRecord``.
Record: TypeAlias = Any
Item = tuple[TopicPartition, Record, int]
Deserializer = Callable[[bytes], Any]

# One internal Kafka poll never holds the fetch lock longer than this, so an assignment
# change waits at most this long for its turn. A hand-off waits for it up to twice (the
# holder's release, the heir's acquire): at 200 ms that was most of a hand-off's 0.5 s p99
# (bench/handoff.py); a poll returns as soon as records are buffered, so a shorter slice
# costs only idle wake-ups (bench/consumer.py's filter rate was unchanged).
_POLL_SLICE_S = 0.05


class FetchInterrupted(Exception):
    """A waiting ``until_buffered`` was asked to give up (``run()`` is stopping)."""


@dataclasses.dataclass(frozen=True, slots=True)
class OutsideLog:
    """A partition whose read position lies outside its log, and the high watermark of a
    fetch answered since the position was sought."""

    tp: TopicPartition
    position: int
    high_watermark: int


OutsideLogHandler = Callable[[list[OutsideLog]], Awaitable[None]]


class Status(Protocol):
    """What a fetch asks of the consumer while it waits (``client.status``)."""

    def may_hand_out(self) -> bool:
        """The hand-out guard (docs/design.md §5)."""

    def check_running(self) -> None:
        """Raises once the consumer stopped, or it or its membership failed."""

    def change_future(self) -> asyncio.Future[None]:
        """Resolved when the assignment changes (or fails, or the consumer stops)."""


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


class Fetcher:
    """Reads Kafka for the tracker's slices and buffers what may be handed out.

    ``lock`` serialises a poll against assignment changes (``sync``, ``revoking`` and the
    tracker's slice changes happen with it held). The consumer's ``status`` raises when
    the consumer stopped or its membership failed, and resolves a ``change_future`` when the
    assignment changes, so a fetch with nothing assigned waits for it instead of polling.

    A read position outside the partition's log is handed to ``on_outside_log`` (which applies
    the reset policy), never skipped over: Kafka refuses such a fetch with
    ``OFFSET_OUT_OF_RANGE``, which aiokafka raises because it is told ``auto_offset_reset=
    "none"``; a broker that answers with an empty fetch instead shows it by a high watermark
    below the position. Only a high watermark from a fetch answered since the last seek
    counts: an older one may predate records a new slice starts after.
    """

    def __init__(
        self,
        tracker: OffsetTracker,
        kafka_kwargs: Mapping[str, Any],
        *,
        key_deserializer: Deserializer | None,
        value_deserializer: Deserializer | None,
        status: Status,
        on_outside_log: OutsideLogHandler,
    ) -> None:
        self._tracker = tracker
        # The policy is applied by on_outside_log, with the slices' own positions in view.
        self._kafka_kwargs = {**kafka_kwargs, "auto_offset_reset": "none"}
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._may_hand_out = status.may_hand_out
        self._check_running = status.check_running
        self._change_future = status.change_future
        self._on_outside_log = on_outside_log
        self._kafka: AIOKafkaConsumer | None = None
        # Per partition, aiokafka's last poll time when we last sought it: a high watermark
        # counts once that time moved on.
        self._seek_stamps: dict[TopicPartition, int | None] = {}
        # Partitions whose position the broker refused, read from their log start only until a
        # fetch there tells the high watermark: their log start, by partition.
        self._probing: dict[TopicPartition, int] = {}
        self.lock = asyncio.Lock()
        # Fetched records not handed out yet, in fetch order; never holds an exhausted run.
        self._buffer: deque[Run] = deque()

    async def start(self) -> None:
        kafka = AIOKafkaConsumer(enable_auto_commit=False, **self._kafka_kwargs)
        try:
            await kafka.start()
        except BaseException:
            await kafka.stop()
            raise
        self._kafka = kafka

    async def stop(self) -> None:
        if self._kafka is not None:
            async with self.lock:
                await stop_consumer(self._kafka)

    def kafka(self) -> AIOKafkaConsumer:
        if self._kafka is None:
            raise ConsumerStopped("the consumer is not started")
        return self._kafka

    @property
    def buffered(self) -> bool:
        return bool(self._buffer)

    def buffered_count(self) -> int:
        return sum(len(run.records) - run.next for run in self._buffer)

    async def start_positions(
        self, partitions: list[TopicPartition], auto_offset_reset: str
    ) -> dict[TopicPartition, int]:
        """Where partitions the group never committed start (``auto_offset_reset``)."""
        if not partitions:
            return {}
        kafka = self.kafka()
        if auto_offset_reset == "earliest":
            return dict(await kafka.beginning_offsets(partitions))
        return dict(await kafka.end_offsets(partitions))

    # ----------------------------------------------------------------- handing out

    async def next_item(
        self, deadline: float | None, interrupt: asyncio.Future[None] | None = None
    ) -> Item:
        """The next record to hand out, waiting as ``until_buffered`` does."""
        await self.until_buffered(deadline, interrupt)
        return self.take_one()

    def take_one(self) -> Item:
        run = self._buffer[0]
        index = run.next
        run.next = index + 1
        if run.next == len(run.records):
            self._buffer.popleft()
        return run.tp, run.records[index], run.hashes[index]

    def take_batch(self, max_records: int | None) -> dict[TopicPartition, Run]:
        """Up to ``max_records`` buffered records (all with None) as one run per partition;
        whole runs move as list slices, with no Python step per record."""
        remaining = self.buffered_count() if max_records is None else max_records
        handed: dict[TopicPartition, Run] = {}
        while self._buffer and remaining > 0:
            run = self._buffer[0]
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
                self._buffer.popleft()
            else:
                run.next = end
        return handed

    async def until_buffered(
        self, deadline: float | None, interrupt: asyncio.Future[None] | None = None
    ) -> None:
        """Fetch until a record is ready to hand out; TimeoutError at ``deadline`` (after at
        least one poll), ``FetchInterrupted`` once ``interrupt`` is done."""
        polled = False
        while True:
            self._check_running()
            if interrupt is not None and interrupt.done():
                raise FetchInterrupted
            lost = not self._may_hand_out()
            if self._buffer and not lost:
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if polled and remaining is not None and remaining <= 0:
                raise TimeoutError
            kafka = self.kafka()
            if lost or not kafka.assignment():
                # Lost: nothing to hand out until the member rejoined and acquired slices.
                waits: set[asyncio.Future[None]] = {self._change_future()}
                if interrupt is not None:
                    waits.add(interrupt)
                await asyncio.wait(
                    waits,
                    timeout=None if remaining is None else max(remaining, 0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                polled = True
                continue
            polled = True
            poll = _POLL_SLICE_S if remaining is None else max(min(remaining, _POLL_SLICE_S), 0)
            async with self.lock:
                refused: dict[TopicPartition, int] = {}
                try:
                    batches = await kafka.getmany(timeout_ms=int(poll * 1000))
                except OffsetOutOfRangeError as error:
                    refused, batches = dict(error.args[0]), {}
                if not self._may_hand_out():
                    # Lost during the poll: these records belong to slices no longer ours.
                    continue
                for tp, records in batches.items():
                    if tp not in self._probing:
                        self._examine(tp, records)
                await self._probe(refused)
                outside = self._outside_log()
            if outside:
                await self._on_outside_log(outside)

    # ----------------------------------------------------------------- log bounds

    async def _probe(self, refused: Mapping[TopicPartition, int]) -> None:
        """Read refused partitions from their log start, to learn their high watermark."""
        kafka = self.kafka()
        wanted = [tp for tp in refused if tp in kafka.assignment()]
        if not wanted:
            return
        starts = await kafka.beginning_offsets(wanted)
        for tp in wanted:
            self._seek(tp, int(starts[tp]))
            self._probing[tp] = int(starts[tp])

    def _outside_log(self) -> list[OutsideLog]:
        """Partitions read from a position outside the log, or whose slices take records past
        the log end as processed (the group's state was committed against a log that is
        gone, even where the read position itself is inside this one)."""
        kafka = self.kafka()
        outside: list[OutsideLog] = []
        for tp in kafka.assignment():
            position = self._tracker.read_position(tp)
            reach = self._tracker.reach(tp)
            if position is None or reach is None:
                continue
            if kafka.last_poll_timestamp(tp) == self._seek_stamps.get(tp):
                continue
            high: int | None = kafka.highwater(tp)
            if high is None:
                continue
            log_start = self._probing.get(tp)
            if out_of_range(reach, None, high):
                outside.append(OutsideLog(tp, reach, high))
            elif out_of_range(position, log_start, high):
                outside.append(OutsideLog(tp, position, high))
            elif log_start is not None:
                # The log grew to the position meanwhile: read on from it.
                self._seek(tp, position)
        return outside

    # ----------------------------------------------------------------- filtering

    def _examine(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        """Hot path: keep our unprocessed records, count every record as seen."""
        if not records:
            return
        active = [progress for progress in self._tracker.slices_of(tp) if progress.active]
        in_bulk = (
            len(active) == 1
            and self._key_deserializer is None
            and self._value_deserializer is None
            and self._examine_run(tp, records, active[0])
        )
        if active and not in_bulk:
            accept: Callable[[TopicPartition, int, int], bool]
            if len(active) == 1:
                # The usual case, one slice per partition: the range check inlined.
                only = active[0]
                low, high, accept_own = only.keys.start, only.keys.end, only.accept

                def accept_one(_: TopicPartition, offset: int, hashed: int) -> bool:
                    return low <= hashed <= high and accept_own(offset, hashed)

                accept = accept_one
            else:
                accept = self._tracker.accept
            key_decode, value_decode = self._key_deserializer, self._value_deserializer
            kept: list[Record] = []
            kept_offsets: list[int] = []
            kept_hashes: list[int] = []
            for record, hashed in zip(records, hash_records(records), strict=True):
                offset = record.offset
                if accept(tp, offset, hashed):
                    if key_decode is not None or value_decode is not None:
                        record = _decoded(record, key_decode, value_decode)
                    kept.append(record)
                    kept_offsets.append(offset)
                    kept_hashes.append(hashed)
            if kept:
                self._buffer.append(Run(tp, kept, kept_offsets, kept_hashes))
        self._tracker.advance(tp, records[-1].offset + 1)

    def _examine_run(
        self, tp: TopicPartition, records: Sequence[Record], only: SliceProgress
    ) -> bool:
        """The common case in bulk: one owned slice, nothing to deserialise, and a fetch that
        lies wholly past what the slice has seen and what the group committed. Each step is
        one comprehension or one C-level extend instead of Python calls per record."""
        hashes = hash_records(records)
        low, high = only.keys.start, only.keys.end
        kept: list[Record]
        if low == HASH_MIN and high == HASH_MAX:
            kept, kept_hashes = list(records), hashes
        else:
            inside = [low <= hashed <= high for hashed in hashes]
            kept = list(compress(records, inside))
            if not kept:
                return True
            kept_hashes = list(compress(hashes, inside))
        offsets = [record.offset for record in kept]
        if not only.accept_run(offsets, kept_hashes):
            return False
        self._buffer.append(Run(tp, kept, offsets, kept_hashes))
        return True

    # ----------------------------------------------------------------- assignment changes

    def sync(self, seek: Mapping[TopicPartition, object]) -> None:
        """Assign Kafka the partitions of active slices; (re)start reading where each
        slice needs it. Called with ``lock`` held."""
        kafka = self.kafka()
        wanted = set(self._tracker.owned())
        reassign = wanted != set(kafka.assignment())
        if reassign:
            kafka.assign(sorted(wanted))
            for tp in set(self._seek_stamps) - wanted:
                del self._seek_stamps[tp]
                self._probing.pop(tp, None)
        for tp in sorted(wanted):
            if reassign or tp in seek:
                position = self._tracker.read_position(tp)
                if position is not None:
                    self._seek(tp, position)

    def _seek(self, tp: TopicPartition, position: int) -> None:
        kafka = self.kafka()
        kafka.seek(tp, position)
        self._seek_stamps[tp] = kafka.last_poll_timestamp(tp)
        self._probing.pop(tp, None)

    def revoking(self, slices: Slices) -> None:
        """Drop buffered records of ``slices``: they are not to be handed out any more."""
        kept_runs: deque[Run] = deque()
        for run in self._buffer:
            left = run.hashes[run.next :]
            keep = [not in_slices(slices, run.tp, hashed) for hashed in left]
            records = list(compress(run.records[run.next :], keep))
            if records:
                offsets = list(compress(run.offsets[run.next :], keep))
                kept_runs.append(Run(run.tp, records, offsets, list(compress(left, keep))))
        self._buffer = kept_runs

    def clear(self) -> None:
        self._buffer.clear()


def in_slices(slices: Slices, tp: TopicPartition, hashed: int) -> bool:
    ranges = slices.get(tp)
    return ranges is not None and in_ranges(ranges, hashed)


def _decoded(
    record: Record,
    key_decode: Deserializer | None,
    value_decode: Deserializer | None,
) -> Record:
    key, value = record.key, record.value
    return dataclasses.replace(
        record,
        key=key if key is None or key_decode is None else key_decode(key),
        value=value if value is None or value_decode is None else value_decode(value),
    )
