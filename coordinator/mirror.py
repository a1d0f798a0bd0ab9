"""The offset mirror: each group's stable offsets committed into a Kafka consumer group, so
the tools Kafka users already run (``kafka-consumer-groups --describe``, Burrow, KEDA's Kafka
scaler, Kafka UI, Redpanda Console) show Keyrange groups and their lag (docs/design.md,
"Offsets mirrored into Kafka").

One replica mirrors at a time: each round runs under a transaction-scoped advisory lock,
and the others skip it. With two replicas writing at once, one that read the stable
offsets before a commit could write them after the other wrote newer ones, and Kafka would
show an older offset until the next round. Under the lock each round reads the stored
offsets and Kafka's, and writes only those that differ, so a steady group costs one offset
read per round and no write.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.core.mirror import (
    MIRROR_METADATA,
    SkippedGroups,
    TopicPartition,
    kafka_group_name,
    offsets_to_mirror,
)
from coordinator.groups.metadata_repository import stable_offsets
from coordinator.kafka import KafkaClusterError
from coordinator.kafka_groups import KafkaGroups
from coordinator.settings import Settings

log = logging.getLogger(__name__)

# "KRm": a two-key advisory lock apart from every other application's on a shared database.
_MIRROR_LOCK = (0x4B526D, 0)


async def mirror_once(
    engine: AsyncEngine, kafka: KafkaGroups, prefix: str, skipped: SkippedGroups
) -> dict[str, dict[TopicPartition, int]] | None:
    """Mirror every group's stable offsets that Kafka does not hold yet; returns what was
    written, by Kafka group, or None when another replica holds the round."""
    written: dict[str, dict[TopicPartition, int]] = {}
    async with engine.begin() as connection:
        locked = await connection.scalar(
            text("SELECT pg_try_advisory_xact_lock(:a, :b)"),
            {"a": _MIRROR_LOCK[0], "b": _MIRROR_LOCK[1]},
        )
        if not locked:
            return None
        by_group: dict[str, dict[TopicPartition, int]] = defaultdict(dict)
        for (group_id, topic, partition), offset in (await stable_offsets(connection)).items():
            by_group[group_id][(topic, partition)] = offset
        for group_id, stored in sorted(by_group.items()):
            group = kafka_group_name(prefix, group_id)
            try:
                wrote = await _mirror_group(kafka, group, stored, skipped)
            except KafkaClusterError as exc:
                if exc.retriable:
                    raise
                if skipped.first_time(group):
                    log.warning(
                        "cannot mirror offsets into a Kafka group",
                        extra={"kafka_group": group, "error": str(exc)},
                    )
                continue
            if wrote:
                written[group] = wrote
    return written


async def _mirror_group(
    kafka: KafkaGroups, group: str, stored: dict[TopicPartition, int], skipped: SkippedGroups
) -> dict[TopicPartition, int]:
    changed = offsets_to_mirror(stored, await kafka.committed(group, sorted(stored)))
    if not changed:
        skipped.written(group)
        return {}
    state = await kafka.describe(group)
    if state.members:
        # Kafka would refuse the commit anyway; asking first keeps the log to one line.
        if skipped.first_time(group):
            log.warning(
                "not mirroring offsets into a Kafka group that has live Kafka members",
                extra={"kafka_group": group, "members": state.members, "state": state.state},
            )
        return {}
    await kafka.commit(group, changed, MIRROR_METADATA)
    skipped.written(group)
    return changed


def mirror_loops(settings: Settings) -> dict[str, Callable[[FastAPI], Awaitable[None]]]:
    """The mirror's background loop when ``mirror_offsets`` is on and Kafka is configured."""
    if settings.mirror_offsets == "off":
        return {}

    async def offset_mirror(app: FastAPI) -> None:
        skipped = SkippedGroups()
        while True:
            cluster = getattr(app.state, "cluster", None)
            if cluster is not None:
                try:
                    await mirror_once(
                        app.state.engine,
                        KafkaGroups(cluster),
                        settings.mirror_group_prefix,
                        skipped,
                    )
                except KafkaClusterError as exc:
                    log.warning("offset mirror round failed", extra={"error": str(exc)})
            await asyncio.sleep(settings.metadata_refresh_ms / 1000)

    return {"offset-mirror": offset_mirror}
