"""The age of each partition's oldest unprocessed record: now minus the timestamp of the
record at the group's stable offset, read from Kafka (coordinator/kafka_records.py). Every
record below the stable offset is processed, so no unprocessed record is older; records
committed individually above it do not change the figure.

Timestamps are cached per group and partition, so a scrape or a page view does not cost a
fetch per partition each time: a record at an offset never changes, so a cached timestamp
for the same stable offset is used until the offset moves; once it moved, the previous
timestamp serves until it is a metadata refresh old (an upper bound on the age, since the
record at the newer offset is no older), then the new record's timestamp is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator import metrics
from coordinator.groups.metadata_repository import stable_offsets
from coordinator.kafka import ClusterMetadata, KafkaClusterError
from coordinator.kafka_records import RecordTimestamps
from coordinator.settings import Settings

log = logging.getLogger(__name__)

PartitionKey = tuple[str, str, int]
"""(group id, topic, partition)."""

# Entries not asked for in this many refresh intervals belong to deleted groups or partitions.
_FORGET_AFTER_REFRESHES = 10


@dataclass(frozen=True)
class _Read:
    offset: int
    timestamp_ms: int | None
    read_at_s: float
    asked_at_s: float


class OldestUnprocessed:
    """Cached timestamps of the records at stable offsets, per (group, topic, partition)."""

    def __init__(
        self,
        refresh_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._refresh_s = refresh_s
        self._monotonic = monotonic
        self._wall = wall
        self._reads: dict[PartitionKey, _Read] = {}

    async def ages(
        self, cluster: ClusterMetadata | None, stable: Mapping[PartitionKey, int]
    ) -> dict[PartitionKey, float]:
        """Age in seconds of each partition's oldest unprocessed record; absent where every
        record is processed (no record at the stable offset) or Kafka could not say."""
        now = self._monotonic()
        stale = {key: offset for key, offset in stable.items() if self._stale(key, offset, now)}
        if stale and cluster is not None:
            await self._read(cluster, stale, now)
        ages: dict[PartitionKey, float] = {}
        wall_ms = self._wall() * 1000
        for key in stable:
            read = self._reads.get(key)
            if read is None:
                continue
            self._reads[key] = _Read(read.offset, read.timestamp_ms, read.read_at_s, now)
            if read.timestamp_ms is not None:
                ages[key] = max(0.0, (wall_ms - read.timestamp_ms) / 1000)
        self._forget(now)
        return ages

    def _stale(self, key: PartitionKey, offset: int, now: float) -> bool:
        read = self._reads.get(key)
        if read is None or read.offset > offset:
            return True
        if read.offset == offset and read.timestamp_ms is not None:
            return False
        return now - read.read_at_s >= self._refresh_s

    async def _read(
        self, cluster: ClusterMetadata, stale: Mapping[PartitionKey, int], now: float
    ) -> None:
        positions = {
            ((topic, partition), offset) for (_, topic, partition), offset in stale.items()
        }
        try:
            found = await RecordTimestamps(cluster).first_at(positions)
        except KafkaClusterError as exc:
            log.warning("record timestamps unavailable", extra={"error": type(exc).__name__})
            return
        for (group_id, topic, partition), offset in stale.items():
            timestamp = found.get(((topic, partition), offset))
            self._reads[(group_id, topic, partition)] = _Read(offset, timestamp, now, now)

    def _forget(self, now: float) -> None:
        horizon = now - _FORGET_AFTER_REFRESHES * self._refresh_s
        for key in [key for key, read in self._reads.items() if read.asked_at_s < horizon]:
            del self._reads[key]


def oldest_unprocessed(app: FastAPI) -> OldestUnprocessed:
    """The app's one cache, made on first use at the metadata refresh cadence."""
    cache: OldestUnprocessed | None = getattr(app.state, "oldest_unprocessed", None)
    if cache is None:
        cache = OldestUnprocessed(app.state.settings.metadata_refresh_ms / 1000)
        app.state.oldest_unprocessed = cache
    return cache


async def update_age_gauges(
    engine: AsyncEngine,
    cluster: ClusterMetadata,
    cache: OldestUnprocessed,
    exported: set[PartitionKey],
) -> set[PartitionKey]:
    """Set the per-partition gauge: 0 where the stable offset is the log end, the cached age
    where records wait; returns the label sets exported, to drop those that disappear. Only
    lagging partitions cost a record read, and those at most once per refresh."""
    async with engine.connect() as connection:
        stable = await stable_offsets(connection)
    try:
        marks = await cluster.high_watermarks(sorted({(t, p) for _, t, p in stable}))
    except KafkaClusterError as exc:
        log.warning("high watermarks unavailable", extra={"error": type(exc).__name__})
        return exported
    lagging = {key: offset for key, offset in stable.items() if marks.get(key[1:], offset) > offset}
    ages = await cache.ages(cluster, lagging)
    current: set[PartitionKey] = set()
    for key in stable:
        if key[1:] not in marks or (key in lagging and key not in ages):
            continue
        group_id, topic, partition = key
        metrics.PARTITION_OLDEST_UNPROCESSED_AGE.labels(group_id, topic, str(partition)).set(
            ages.get(key, 0.0)
        )
        current.add(key)
    for group_id, topic, partition in exported - current:
        metrics.PARTITION_OLDEST_UNPROCESSED_AGE.remove(group_id, topic, str(partition))
    return current


def record_age_loops(settings: Settings) -> dict[str, Callable[[FastAPI], Awaitable[None]]]:
    """The gauge's loop, where per-group series are served (as the lag gauge's)."""
    if not (settings.metrics_group_labels or settings.metrics_tokens):
        return {}

    async def oldest_unprocessed_gauges(app: FastAPI) -> None:
        exported: set[PartitionKey] = set()
        while True:
            cluster = getattr(app.state, "cluster", None)
            if cluster is not None:
                exported = await update_age_gauges(
                    app.state.engine, cluster, oldest_unprocessed(app), exported
                )
            await asyncio.sleep(settings.metadata_refresh_ms / 1000)

    return {"oldest-unprocessed-gauges": oldest_unprocessed_gauges}
