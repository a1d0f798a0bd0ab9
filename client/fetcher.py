"""Fetching and key filtering: one ``AIOKafkaConsumer`` in manual-assignment mode, read for the
partitions of the slices held, and a buffer of the fetched records whose key hash falls in an
active slice and that the group has not processed yet, in fetch order.

The records are judged on the fetched batches, before aiokafka builds them
(``client.raw_filter``): a record of another member's keys is never made a Python object.
The buffer is ``client.fetch_buffer``'s, the read positions against the logs
``client.fetch_bounds``'.

The hand-out guard (``may_hand_out``, the membership's session deadline) is asked before a
poll's records are buffered and before ``until_buffered`` says a record is ready, so nothing
fetched for slices that were just lost reaches the buffer or leaves it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import OffsetOutOfRangeError
from aiokafka.structs import TopicPartition

from client.errors import ConsumerStopped
from client.fetch_bounds import LogBounds, OutsideLog, OutsideLogHandler
from client.fetch_buffer import FetchBuffer, Item, Record, Run, in_slices
from client.http import Slices
from client.kafka_stop import stop_consumer
from client.raw_filter import RawFilter, install
from client.topic_watch import watch_missing_topics
from client.tracker import OffsetTracker

__all__ = [
    "FetchInterrupted",
    "Fetcher",
    "Item",
    "OutsideLog",
    "Record",
    "Run",
    "Status",
    "in_slices",
]

Deserializer = Callable[[bytes], Any]

logger = logging.getLogger(__name__)

# One internal Kafka poll never holds the fetch lock longer than this, so an assignment
# change waits at most this long for its turn. A hand-off waits for it up to twice (the
# holder's release, the heir's acquire): at 200 ms that was most of a hand-off's 0.5 s p99
# (bench/handoff.py); a poll returns as soon as records are buffered, so a shorter slice
# costs only idle wake-ups (bench/consumer.py's filter rate was unchanged).
_POLL_SLICE_S = 0.05


class FetchInterrupted(Exception):
    """A waiting ``until_buffered`` was asked to give up (``run()`` is stopping)."""


class Status(Protocol):
    """What a fetch asks of the consumer while it waits (``client.status``)."""

    def may_hand_out(self) -> bool:
        """The hand-out guard (docs/design.md §5)."""

    def check_running(self) -> None:
        """Raises once the consumer stopped, or it or its membership failed."""

    def change_future(self) -> asyncio.Future[None]:
        """Resolved when the assignment changes (or fails, or the consumer stops)."""


class Fetcher:
    """Reads Kafka for the tracker's slices and buffers what may be handed out.

    ``lock`` serialises a poll against assignment changes (``sync``, ``revoking`` and the
    tracker's slice changes happen with it held): the raw filter judges a poll's batches
    against the slices as they are while it holds the lock. The consumer's ``status`` raises
    when the consumer stopped or its membership failed, and resolves a ``change_future`` when
    the assignment changes, so a fetch with nothing assigned waits for it instead of polling.
    A read position outside its log goes to ``on_outside_log`` (``client.fetch_bounds``).
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
        subscribed: Sequence[str] = (),
    ) -> None:
        self._tracker = tracker
        # Named in a WARNING while Kafka does not know them (``client.topic_watch``).
        self._subscribed = tuple(subscribed)
        self._topic_watch: asyncio.Task[None] | None = None
        # The policy is applied by on_outside_log, with the slices' own positions in view.
        self._kafka_kwargs = {**kafka_kwargs, "auto_offset_reset": "none"}
        self._filter = RawFilter(
            tracker.bounds,
            key_deserializer=key_deserializer,
            value_deserializer=value_deserializer,
        )
        self._may_hand_out = status.may_hand_out
        self._check_running = status.check_running
        self._change_future = status.change_future
        self._on_outside_log = on_outside_log
        self._kafka: AIOKafkaConsumer | None = None
        self._bounds = LogBounds(tracker, self.kafka)
        self.lock = asyncio.Lock()
        self._buffer = FetchBuffer(tracker)

    async def start(self) -> None:
        if not self._filter.in_c:
            logger.warning(
                "the C key filter is not installed (client.protocol._keyfilter: keyrange was "
                "installed without a C compiler); fetched records are judged in Python, several "
                "times slower per record fetched"
            )
        kafka = AIOKafkaConsumer(enable_auto_commit=False, **self._kafka_kwargs)
        try:
            await kafka.start()
            install(kafka, self._filter)
        except BaseException:
            await kafka.stop()
            raise
        self._kafka = kafka
        if self._subscribed:
            self._topic_watch = asyncio.create_task(
                watch_missing_topics(self._subscribed, self._existing_topics),
                name="keyrange-topic-watch",
            )

    async def _existing_topics(self) -> set[str]:
        return set(await self.kafka().topics())

    async def stop(self) -> None:
        if self._topic_watch is not None:
            self._topic_watch.cancel()
        if self._kafka is not None:
            async with self.lock:
                await stop_consumer(self._kafka)

    def kafka(self) -> AIOKafkaConsumer:
        if self._kafka is None:
            raise ConsumerStopped("the consumer is not started")
        return self._kafka

    @property
    def judges_in_c(self) -> bool:
        """Whether fetched batches are judged by the C filter."""
        return self._filter.in_c

    @property
    def buffered(self) -> bool:
        return bool(self._buffer)

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
        return self._buffer.take_one()

    def take_batch(self, max_records: int | None) -> dict[TopicPartition, Run]:
        """Up to ``max_records`` buffered records (all with None) as one run per partition."""
        return self._buffer.take_batch(max_records)

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
                    # Judged batches (client.raw_filter), not records.
                    batches = await kafka.getmany(timeout_ms=int(poll * 1000))
                except OffsetOutOfRangeError as error:
                    refused, batches = dict(error.args[0]), {}
                if not self._may_hand_out():
                    # Lost during the poll: these records belong to slices no longer ours.
                    continue
                for tp, judged in batches.items():
                    if not self._bounds.probing(tp):
                        self._buffer.add(tp, judged)
                await self._bounds.probe(refused)
                outside = self._bounds.outside_log()
            if outside:
                await self._on_outside_log(outside)

    # ----------------------------------------------------------------- assignment changes

    def sync(self, seek: Mapping[TopicPartition, object]) -> None:
        """Assign Kafka the partitions of active slices; (re)start reading where each
        slice needs it. Called with ``lock`` held."""
        kafka = self.kafka()
        wanted = set(self._tracker.owned())
        reassign = wanted != set(kafka.assignment())
        if reassign:
            kafka.assign(sorted(wanted))
            self._bounds.forget(self._bounds.sought() - wanted)
        for tp in sorted(wanted):
            if reassign or tp in seek:
                position = self._tracker.read_position(tp)
                if position is not None:
                    self._bounds.seek(tp, position)

    def revoking(self, slices: Slices) -> None:
        """Drop buffered records of ``slices``: they are not to be handed out any more."""
        self._buffer.drop(slices)

    def clear(self) -> None:
        self._buffer.clear()
