"""Where a member's read positions lie against the partitions' logs, as its fetches show it.

A read position outside the partition's log is handed to the consumer's ``on_outside_log``
(which applies the reset policy), never skipped over: Kafka refuses such a fetch with
``OFFSET_OUT_OF_RANGE``, which aiokafka raises because it is told ``auto_offset_reset=
"none"``; a broker that answers with an empty fetch instead shows it by a high watermark
below the position. Only a high watermark from a fetch answered since the last seek counts:
an older one may predate records a new slice starts after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from client.protocol.log_bounds import out_of_range
from client.tracker import OffsetTracker


@dataclasses.dataclass(frozen=True, slots=True)
class OutsideLog:
    """A partition whose read position lies outside its log, and the high watermark of a
    fetch answered since the position was sought."""

    tp: TopicPartition
    position: int
    high_watermark: int


OutsideLogHandler = Callable[[list[OutsideLog]], Awaitable[None]]


class LogBounds:
    """Seeks the fetch's partitions and judges their positions against the answers."""

    def __init__(self, tracker: OffsetTracker, kafka: Callable[[], AIOKafkaConsumer]) -> None:
        self._tracker = tracker
        self._kafka = kafka
        # Per partition, aiokafka's last poll time when we last sought it: a high watermark
        # counts once that time moved on.
        self._seek_stamps: dict[TopicPartition, int | None] = {}
        # Partitions whose position the broker refused, read from their log start only until a
        # fetch there tells the high watermark: their log start, by partition.
        self._probing: dict[TopicPartition, int] = {}

    def probing(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` is read from its log start only to learn its high watermark (what
        such a fetch returns is no record of the slices)."""
        return tp in self._probing

    def seek(self, tp: TopicPartition, position: int) -> None:
        kafka = self._kafka()
        kafka.seek(tp, position)
        self._seek_stamps[tp] = kafka.last_poll_timestamp(tp)
        self._probing.pop(tp, None)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions no longer read."""
        for tp in partitions:
            self._seek_stamps.pop(tp, None)
            self._probing.pop(tp, None)

    def sought(self) -> set[TopicPartition]:
        return set(self._seek_stamps)

    async def probe(self, refused: Mapping[TopicPartition, int]) -> None:
        """Read refused partitions from their log start, to learn their high watermark."""
        kafka = self._kafka()
        wanted = [tp for tp in refused if tp in kafka.assignment()]
        if not wanted:
            return
        starts = await kafka.beginning_offsets(wanted)
        for tp in wanted:
            self.seek(tp, int(starts[tp]))
            self._probing[tp] = int(starts[tp])

    def outside_log(self) -> list[OutsideLog]:
        """Partitions read from a position outside the log, or whose slices take records past
        the log end as processed (the group's state was committed against a log that is
        gone, even where the read position itself is inside this one)."""
        kafka = self._kafka()
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
                self.seek(tp, position)
        return outside
