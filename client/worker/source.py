"""The slice lag the worker's metrics read from its source (``client.runtime.seams``)."""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange
from client.runtime.seams import WorkerSource


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
