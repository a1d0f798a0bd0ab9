"""SQL of what the membership reads beside groups and members: topics' partition counts (as
the metadata refresh stores them) and per-topic ``accept.range.fetch``, and the figures the
membership gauges export."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from sqlalchemy import bindparam, delete, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.db.models import Member, PartitionOffsets, TopicConfig, TopicMetadata

# Built once: every locked heartbeat reads both, and a statement built per call costs more
# Python than its round trip and leaves reference cycles for the collector.
_ALL_PARTITION_COUNTS = select(TopicMetadata.topic, TopicMetadata.partition_count)
_PARTITION_COUNTS = _ALL_PARTITION_COUNTS.where(
    TopicMetadata.topic.in_(bindparam("topics", expanding=True))
)
_RANGE_FETCH = select(TopicConfig.topic, TopicConfig.accept_range_fetch).where(
    TopicConfig.topic.in_(bindparam("topics", expanding=True))
)


async def read_partition_counts(
    connection: AsyncConnection, topics: Collection[str] | None = None
) -> dict[str, int]:
    """Known partition counts; all of them when ``topics`` is None (regex subscriptions)."""
    if topics is None:
        result = await connection.execute(_ALL_PARTITION_COUNTS)
    elif not topics:
        return {}
    else:
        result = await connection.execute(_PARTITION_COUNTS, {"topics": sorted(topics)})
    return {row.topic: int(row.partition_count) for row in result}


async def read_range_fetch(connection: AsyncConnection, topics: Collection[str]) -> dict[str, bool]:
    """Explicit per-topic ``accept.range.fetch``; topics without a row use the default."""
    if not topics:
        return {}
    result = await connection.execute(_RANGE_FETCH, {"topics": sorted(topics)})
    return {row.topic: bool(row.accept_range_fetch) for row in result}


async def write_partition_counts(connection: AsyncConnection, counts: Mapping[str, int]) -> None:
    if not counts:
        return
    statement = insert(TopicMetadata).values(
        [{"topic": topic, "partition_count": count} for topic, count in sorted(counts.items())]
    )
    await connection.execute(
        statement.on_conflict_do_update(
            index_elements=[TopicMetadata.topic],
            set_={"partition_count": statement.excluded.partition_count, "updated_at": func.now()},
        )
    )


async def delete_partition_counts(connection: AsyncConnection, topics: Iterable[str]) -> None:
    names = sorted(topics)
    if names:
        await connection.execute(delete(TopicMetadata).where(TopicMetadata.topic.in_(names)))


async def live_member_counts(connection: AsyncConnection) -> dict[str, int]:
    result = await connection.execute(
        select(Member.group_id, func.count())
        .where(Member.expires_at > func.now())
        .group_by(Member.group_id)
    )
    return {row[0]: int(row[1]) for row in result}


async def group_count(connection: AsyncConnection) -> int:
    result = await connection.execute(text("SELECT count(*) FROM groups"))
    return int(result.scalar_one())


async def stored_ic_range_count(connection: AsyncConnection) -> int:
    """IC ranges held over all groups and partitions: growth means a stuck or dead member."""
    result = await connection.execute(
        text(
            "SELECT coalesce(sum((SELECT count(*) FROM unnest(ic_ranges))), 0) "
            "FROM partition_offsets"
        )
    )
    return int(result.scalar_one())


async def stable_offsets(connection: AsyncConnection) -> dict[tuple[str, str, int], int]:
    """Every committed partition's stable offset, for the lag gauges."""
    result = await connection.execute(
        select(
            PartitionOffsets.group_id,
            PartitionOffsets.topic,
            PartitionOffsets.partition,
            PartitionOffsets.stable_offset,
        )
    )
    return {(row[0], row[1], int(row[2])): int(row[3]) for row in result}
