"""What the worker's engine needs of the consumer (``KeyrangeConsumer.drive`` gives it the
consumer's ``ConsumerSource``), and the slice lag read from it for metrics."""

from __future__ import annotations

from typing import Protocol

from aiokafka.structs import TopicPartition

from client.dispatch import RecordSource
from client.fetcher import Record
from client.protocol.keyspace import KeyRange


class WorkerSource(RecordSource, Protocol):
    """``run()``'s seams plus giving records back, pausing fetches and reading progress."""

    def give_back(self, record: Record) -> None: ...

    def session_deadline(self) -> float:
        """The monotonic instant from which nothing may be handed out; a thread may ask."""

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def highwater(self, tp: TopicPartition) -> int | None: ...

    def slice_watermarks(self) -> list[tuple[TopicPartition, KeyRange, int]]: ...


def slice_lag(source: WorkerSource) -> list[tuple[TopicPartition, KeyRange, int]]:
    """Per owned slice, the offsets between its commit point and the partition's end as the
    last fetch saw it (records of other slices in between count: Kafka knows offsets, not
    keys)."""
    lags = []
    for tp, keys, watermark in source.slice_watermarks():
        end = source.highwater(tp)
        if end is not None:
            lags.append((tp, keys, max(end - watermark, 0)))
    return lags
