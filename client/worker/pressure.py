"""Backpressure by bytes (kafka-workers' ``queue.total.size.heap.ratio`` and
``queue.resume.ratio``): records taken from Kafka and not finished are weighed per partition;
a partition over its share of ``max_buffered_bytes`` has its fetching paused, and resumed
once it is back under ``resume_ratio`` of the share. Heartbeats and commits do not go through
the fetch, so they keep flowing while paused."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiokafka.structs import TopicPartition

logger = logging.getLogger(__name__)

Switch = Callable[[list[TopicPartition]], None]


class ByteBudget:
    """Each owned partition may hold ``bound / owned partitions`` bytes, so the total stays
    within the bound (plus the fetch that crossed it) however the records spread."""

    def __init__(self, bound: int, resume_ratio: float, pause: Switch, resume: Switch) -> None:
        self._bound = bound
        self._resume_ratio = resume_ratio
        self._pause = pause
        self._resume = resume
        self._bytes: dict[TopicPartition, int] = {}
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
        self._partitions = max(count, 1)
        for tp in list(self._paused):
            self._check(tp)

    def add(self, tp: TopicPartition, count: int) -> None:
        total = self._bytes[tp] = self._bytes.get(tp, 0) + count
        if total <= self._share():
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

    def release(self, tp: TopicPartition, count: int) -> None:
        total = self._bytes.get(tp, 0) - count
        if total > 0:
            self._bytes[tp] = total
        else:
            self._bytes.pop(tp, None)
        if tp in self._paused:
            self._check(tp)

    def _share(self) -> float:
        return self._bound / self._partitions

    def _check(self, tp: TopicPartition) -> None:
        if self._bytes.get(tp, 0) <= self._share() * self._resume_ratio:
            self._paused.discard(tp)
            self._resume([tp])
            logger.info("fetching resumed", extra={"topic": tp.topic, "partition": tp.partition})
