"""SQL of what the membership reads beside groups and members: topics' partition counts (as
the metadata refresh stores them) and per-topic ``accept.range.fetch``, and the figures the
membership gauges export."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import ARRAY, Boolean, Text, bindparam, delete, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.db.models import Member, PartitionOffsets, TopicMetadata

# Built once: a statement built per call costs more Python than its round trip and leaves
# reference cycles for the collector.
_ALL_PARTITION_COUNTS = select(TopicMetadata.topic, TopicMetadata.partition_count)
_PARTITION_COUNTS = _ALL_PARTITION_COUNTS.where(
    TopicMetadata.topic.in_(bindparam("topics", expanding=True))
)

# What a step that assigns asks for, in one round trip (it was three): the topics' partition
# counts, their explicit ``accept.range.fetch`` and the coordinator's switches (NULL until
# their row is seeded). Built once, as the statements above.
_TOPIC_FACTS = text(
    """
    WITH counted AS (
        SELECT m.topic, m.partition_count, c.accept_range_fetch
        FROM topic_metadata m LEFT JOIN topic_config c ON c.topic = m.topic
        WHERE :every OR m.topic = ANY(:topics)
    )
    SELECT
        ARRAY(SELECT topic FROM counted ORDER BY topic) AS topics,
        ARRAY(SELECT partition_count FROM counted ORDER BY topic) AS counts,
        ARRAY(SELECT accept_range_fetch FROM counted ORDER BY topic) AS range_fetch,
        s.accept_individual_commit,
        s.default_accept_range_fetch
    FROM (SELECT 1) AS one LEFT JOIN coordinator_config s ON s.id = 1
    """
).bindparams(bindparam("every", type_=Boolean), bindparam("topics", type_=ARRAY(Text)))


@dataclass(frozen=True)
class StoredTopicFacts:
    """Partition counts, explicit ``accept.range.fetch`` (topics with a count and a setting)
    and the stored switches, each None until their row is seeded."""

    partition_counts: dict[str, int]
    accept_range_fetch: dict[str, bool]
    accept_individual_commit: bool | None
    default_accept_range_fetch: bool | None


async def read_topic_facts(
    connection: AsyncConnection, topics: Collection[str] | None
) -> StoredTopicFacts:
    """The facts of ``topics`` (every known topic when None, for regex subscriptions)."""
    row = (
        await connection.execute(
            _TOPIC_FACTS, {"every": topics is None, "topics": sorted(topics or ())}
        )
    ).one()
    names, counts, range_fetch, individual_commit, default_range_fetch = row
    return StoredTopicFacts(
        partition_counts={name: int(count) for name, count in zip(names, counts, strict=True)},
        accept_range_fetch={
            name: bool(accept)
            for name, accept in zip(names, range_fetch, strict=True)
            if accept is not None
        },
        accept_individual_commit=individual_commit,
        default_accept_range_fetch=default_range_fetch,
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


async def lag_positions(
    connection: AsyncConnection,
) -> dict[tuple[str, str, int], tuple[int, int]]:
    """Every committed partition's stable offset and how many offsets above it are committed
    individually (its IC ranges), for the lag gauges: lag is what is not processed yet, as
    the admin API and the scaling figures count it (docs/design.md §9)."""
    result = await connection.execute(
        text(
            "SELECT group_id, topic, partition, stable_offset,"
            " COALESCE((SELECT sum(upper(r) - lower(r)) FROM unnest(ic_ranges) AS r), 0)"
            " FROM partition_offsets"
        )
    )
    return {(row[0], row[1], int(row[2])): (int(row[3]), int(row[4])) for row in result}


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
