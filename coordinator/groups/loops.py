"""The membership's background loops, run by every coordinator replica: reap expired members,
refresh topic metadata from Kafka, export the membership gauges, delete groups idle for the
offset retention."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator import metrics
from coordinator.core.membership import GroupRecord, expiry_reasons
from coordinator.core.topic_pattern import matching_topics
from coordinator.groups import metadata_repository, repository, stuck_repository
from coordinator.groups.settle import (
    lock_existing_group,
    save_group,
    settle_group,
)
from coordinator.groups.stored_topics import StoredTopics
from coordinator.kafka import ClusterMetadata, KafkaClusterError
from coordinator.settings import Settings

log = logging.getLogger(__name__)


BackgroundLoop = Callable[[FastAPI], Awaitable[None]]


# Groups reaped per transaction: bounds how long one reaper pass holds its locks.
REAP_BATCH = 50


async def reap_once(engine: AsyncEngine, settings: Settings) -> list[tuple[str, str]]:
    """Remove expired members of groups no other replica is working on, and reassign.
    ``SKIP LOCKED`` lets replicas split the groups instead of queueing on them."""
    reaped: list[tuple[str, str]] = []
    async with engine.begin() as connection:
        settled: list[tuple[GroupRecord, GroupRecord]] = []
        for group_id in await repository.lock_groups_to_reap(connection, REAP_BATCH):
            group, members, expired = await lock_existing_group(connection, group_id)
            reaped.extend((group_id, member_id) for member_id in expired)
            reasons = expiry_reasons(expired)
            settled.append(
                (
                    group,
                    await settle_group(
                        connection, group, members, settings, reasons, removed=bool(expired)
                    ),
                )
            )
        for before, after in settled:
            await save_group(connection, before, after)
    return reaped


async def refresh_metadata_once(
    engine: AsyncEngine, cluster: ClusterMetadata, stored: StoredTopics
) -> dict[str, int | None]:
    """Re-read partition counts of every live subscription and mark the groups whose topics
    changed for rebalance. Returns the changes (None: the topic is gone). ``stored`` learns
    every count seen stored, before Kafka is asked, and forgets the topics removed."""
    async with engine.connect() as connection:
        subscriptions = await repository.live_subscriptions(connection)
        known = await metadata_repository.read_partition_counts(connection, None)
    stored.remember(known)
    wanted = {t for s in subscriptions for t in s.topics}
    patterns = {s.regex for s in subscriptions if s.regex is not None}
    if patterns:
        cluster_topics = await cluster.list_topics()
        for pattern in patterns:
            wanted |= matching_topics(pattern, cluster_topics)
    counts = await cluster.partition_counts(sorted(wanted)) if wanted else {}
    changes: dict[str, int | None] = {t: c for t, c in counts.items() if known.get(t) != c}
    changes.update({t: None for t in wanted if t in known and t not in counts})
    if not changes:
        return {}
    affected = {s.group_id for s in subscriptions if s.covers(changes)}
    async with engine.begin() as connection:
        await metadata_repository.write_partition_counts(
            connection, {t: c for t, c in changes.items() if c is not None}
        )
        await metadata_repository.delete_partition_counts(
            connection, [t for t, c in changes.items() if c is None]
        )
        await repository.request_rebalances(connection, affected, "partition count changed")
    stored.forget(t for t, c in changes.items() if c is None)
    stored.remember(t for t, c in changes.items() if c is not None)
    log.info(
        "topic metadata changed",
        extra={"topics": sorted(changes), "groups": sorted(affected)},
    )
    return changes


class _GaugeLabels:
    """Remembers which label sets this process exported, to drop those that disappeared."""

    def __init__(self) -> None:
        self.members: set[str] = set()
        self.lag: set[tuple[str, str, str]] = set()


async def update_gauges(
    engine: AsyncEngine,
    cluster: ClusterMetadata | None,
    exported: _GaugeLabels,
    *,
    lag: bool = True,
) -> None:
    """Read the gauges' figures; ``lag``: also the per-partition lag, which costs a fetch per
    broker and is only worth it where the per-group series can be served."""
    lag_cluster = cluster if lag else None
    async with engine.connect() as connection:
        counts = await metadata_repository.live_member_counts(connection)
        groups = await metadata_repository.group_count(connection)
        ic_ranges = await metadata_repository.stored_ic_range_count(connection)
        stuck = await stuck_repository.stuck_figures(connection)
        stable = (
            await metadata_repository.lag_positions(connection) if lag_cluster is not None else {}
        )
    # Set once every figure is read, with no await until the lag below: the gauges are
    # process-wide, and where several apps share a process and a loop (the test suite), one
    # app's stale figure must not land between another's read and set.
    metrics.IC_RANGES_STORED.set(ic_ranges)
    metrics.GROUPS.set(groups)
    metrics.LIVE_MEMBERS.set(sum(counts.values()))
    metrics.STUCK_CALLS.set(sum(figures.calls for figures in stuck.values()))
    metrics.STUCK_CALL_MAX_SECONDS.set(max((f.longest_s for f in stuck.values()), default=0))
    for group_id in exported.members - counts.keys():
        metrics.GROUP_MEMBERS.remove(group_id)
        metrics.MEMBER_STUCK_CALLS.remove(group_id)
        metrics.MEMBER_STUCK_CALL_MAX_SECONDS.remove(group_id)
    none_stuck = stuck_repository.StuckFigures(0, 0.0)
    for group_id, count in counts.items():
        metrics.GROUP_MEMBERS.labels(group_id).set(count)
        figures = stuck.get(group_id, none_stuck)
        metrics.MEMBER_STUCK_CALLS.labels(group_id).set(figures.calls)
        metrics.MEMBER_STUCK_CALL_MAX_SECONDS.labels(group_id).set(figures.longest_s)
    exported.members = set(counts)
    if lag_cluster is None or not stable:
        return
    try:
        marks = await lag_cluster.high_watermarks(sorted({(t, p) for _, t, p in stable}))
    except KafkaClusterError as exc:
        log.warning("high watermarks unavailable", extra={"error": type(exc).__name__})
        return
    current: set[tuple[str, str, str]] = set()
    for (group_id, topic, partition), (offset, individually) in stable.items():
        high = marks.get((topic, partition))
        if high is None:
            continue
        labels = (group_id, topic, str(partition))
        metrics.PARTITION_LAG.labels(*labels).set(max(0, high - offset - individually))
        current.add(labels)
    for labels in exported.lag - current:
        metrics.PARTITION_LAG.remove(*labels)
    exported.lag = current


# Groups deleted per transaction: bounds the locks one retention pass holds at a time.
RETENTION_BATCH = 500


async def expire_groups_once(engine: AsyncEngine, settings: Settings) -> list[str]:
    """Delete the groups idle for ``offsets_retention_minutes`` with their offsets, and drop
    their metric series: those this replica deleted, and those of groups another replica
    deleted since. Safe on every replica at once (see ``delete_expired_groups``)."""
    expired: list[str] = []
    while True:
        async with engine.begin() as connection:
            candidates, deleted = await repository.delete_expired_groups(
                connection, settings.offsets_retention_minutes, RETENTION_BATCH
            )
        expired += deleted
        if candidates < RETENTION_BATCH:
            break
    if expired:
        metrics.GROUPS_EXPIRED.inc(len(expired))
        log.info(
            "groups expired: no members and no commits for the offset retention",
            extra={"count": len(expired), "groups": expired[:100]},
        )
    exported = metrics.groups_with_load()
    if exported:
        async with engine.connect() as connection:
            existing = await repository.existing_groups(connection, exported)
        metrics.forget_groups(exported - existing)
    metrics.forget_groups(expired)
    return expired


def background_loops(settings: Settings) -> dict[str, BackgroundLoop]:
    """The membership loops ``create_app`` runs; each runs until cancelled."""

    async def reaper(app: FastAPI) -> None:
        while True:
            await reap_once(app.state.engine, settings)
            await asyncio.sleep(settings.reaper_interval_ms / 1000)

    async def topic_metadata(app: FastAPI) -> None:
        while True:
            cluster = getattr(app.state, "cluster", None)
            if cluster is not None:
                try:
                    await refresh_metadata_once(app.state.engine, cluster, app.state.stored_topics)
                except KafkaClusterError as exc:
                    log.warning("metadata refresh failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(settings.metadata_refresh_ms / 1000)

    async def membership_metrics(app: FastAPI) -> None:
        exported = _GaugeLabels()
        while True:
            await update_gauges(
                app.state.engine,
                getattr(app.state, "cluster", None),
                exported,
                lag=settings.metrics_group_labels or bool(settings.metrics_tokens),
            )
            await asyncio.sleep(settings.metadata_refresh_ms / 1000)

    async def offset_retention(app: FastAPI) -> None:
        while True:
            await expire_groups_once(app.state.engine, settings)
            await asyncio.sleep(settings.offsets_retention_check_interval_ms / 1000)

    async def membership_watch(app: FastAPI) -> None:
        await app.state.membership_watch.listen(app.state.engine.url)

    loops: dict[str, BackgroundLoop] = {
        "offset-retention": offset_retention,
        "membership-reaper": reaper,
        "topic-metadata-refresh": topic_metadata,
        "membership-metrics": membership_metrics,
    }
    if settings.prompt_handoff:
        loops["membership-watch"] = membership_watch
    return loops
