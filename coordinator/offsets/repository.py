"""All SQL of the offset store.

A commit costs a fixed number of round trips whatever it carries: one statement creates the
group if needed and reads the switches, one locks and reads every partition row of the
request (creating missing rows) in a single statement, one pipelined batch writes them back.
Rows are always locked in (topic, partition) order so concurrent multi-partition commits
cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, delete, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY, INT8MULTIRANGE, Range
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import BigInteger, Integer, Text

from client.committed import CommittedOffsets, Watermark
from client.keyspace import KeyRange
from coordinator.db.models import PartitionOffsets

TopicPartitionKey = tuple[str, int]

_LOCK_ROWS = text(
    """
    INSERT INTO partition_offsets (group_id, topic, partition)
    SELECT :group_id, t, p FROM unnest(:topics, :partitions) AS requested(t, p)
    ON CONFLICT (group_id, topic, partition)
    DO UPDATE SET stable_offset = partition_offsets.stable_offset
    RETURNING topic, partition, stable_offset, ic_ranges, wm_starts, wm_ends, wm_offsets,
              metadata
    """
).bindparams(
    bindparam("topics", type_=ARRAY(Text)),
    bindparam("partitions", type_=ARRAY(Integer)),
)

_ENSURE_GROUP = text(
    """
    WITH created AS (
        INSERT INTO groups (group_id) VALUES (:group_id) ON CONFLICT (group_id) DO NOTHING
    )
    SELECT accept_individual_commit FROM coordinator_config WHERE id = 1
    """
)

_WRITE_ROW = (
    update(PartitionOffsets)
    .where(
        PartitionOffsets.group_id == bindparam("b_group_id"),
        PartitionOffsets.topic == bindparam("b_topic"),
        PartitionOffsets.partition == bindparam("b_partition"),
    )
    .values(
        stable_offset=bindparam("b_stable_offset", type_=BigInteger),
        ic_ranges=bindparam("b_ic_ranges", type_=INT8MULTIRANGE),
        wm_starts=bindparam("b_wm_starts", type_=ARRAY(BigInteger)),
        wm_ends=bindparam("b_wm_ends", type_=ARRAY(BigInteger)),
        wm_offsets=bindparam("b_wm_offsets", type_=ARRAY(BigInteger)),
        metadata_text=bindparam("b_metadata"),
        updated_at=text("now()"),
    )
)


_STATE_COLUMNS = (
    PartitionOffsets.topic,
    PartitionOffsets.partition,
    PartitionOffsets.stable_offset,
    PartitionOffsets.ic_ranges,
    PartitionOffsets.wm_starts,
    PartitionOffsets.wm_ends,
    PartitionOffsets.wm_offsets,
    PartitionOffsets.metadata_text.label("metadata"),
)


@dataclass(frozen=True)
class StoredPartition:
    topic: str
    partition: int
    state: CommittedOffsets


def _ranges_from_db(ranges: Sequence[Range[int]]) -> tuple[tuple[int, int], ...]:
    # Postgres returns canonical half-open int8 ranges [lower, upper).
    return tuple((r.lower, r.upper - 1) for r in ranges if r.lower is not None and r.upper)


def _ranges_to_db(ranges: Sequence[tuple[int, int]]) -> list[Range[int]]:
    return [Range(start, end, bounds="[]") for start, end in ranges]


def _state_from_row(
    stable_offset: int,
    ic_ranges: Sequence[Range[int]],
    wm_starts: Sequence[int],
    wm_ends: Sequence[int],
    wm_offsets: Sequence[int],
    metadata: str | None,
) -> CommittedOffsets:
    return CommittedOffsets(
        stable_offset=stable_offset,
        ranges=_ranges_from_db(ic_ranges),
        watermarks=tuple(
            Watermark(KeyRange(start, end), offset)
            for start, end, offset in zip(wm_starts, wm_ends, wm_offsets, strict=True)
        ),
        metadata=metadata,
    )


async def ensure_group(connection: AsyncConnection, group_id: str) -> bool | None:
    """Create the group if new; return the stored ``accept.individual.commit`` switch."""
    result = await connection.execute(_ENSURE_GROUP, {"group_id": group_id})
    value = result.scalar_one_or_none()
    return None if value is None else bool(value)


async def lock_partitions(
    connection: AsyncConnection, group_id: str, keys: Sequence[TopicPartitionKey]
) -> dict[TopicPartitionKey, CommittedOffsets]:
    """Lock (creating if missing) the rows of ``keys`` in sorted order and return their state."""
    ordered = sorted(keys)
    result = await connection.execute(
        _LOCK_ROWS,
        {
            "group_id": group_id,
            "topics": [topic for topic, _ in ordered],
            "partitions": [partition for _, partition in ordered],
        },
    )
    return {
        (row.topic, row.partition): _state_from_row(
            row.stable_offset,
            row.ic_ranges,
            row.wm_starts,
            row.wm_ends,
            row.wm_offsets,
            row.metadata,
        )
        for row in result
    }


async def write_partitions(
    connection: AsyncConnection, group_id: str, states: dict[TopicPartitionKey, CommittedOffsets]
) -> None:
    if not states:
        return
    await connection.execute(
        _WRITE_ROW,
        [
            {
                "b_group_id": group_id,
                "b_topic": topic,
                "b_partition": partition,
                "b_stable_offset": state.stable_offset,
                "b_ic_ranges": _ranges_to_db(state.ranges),
                "b_wm_starts": [w.keys.start for w in state.watermarks],
                "b_wm_ends": [w.keys.end for w in state.watermarks],
                "b_wm_offsets": [w.offset for w in state.watermarks],
                "b_metadata": state.metadata,
            }
            for (topic, partition), state in sorted(states.items())
        ],
    )


async def read_partitions(
    connection: AsyncConnection,
    group_id: str,
    topics: Sequence[str] | None = None,
    partitions: Sequence[int] | None = None,
) -> list[StoredPartition]:
    query = select(*_STATE_COLUMNS).where(PartitionOffsets.group_id == group_id)
    if topics:
        query = query.where(PartitionOffsets.topic.in_(topics))
    if partitions:
        query = query.where(PartitionOffsets.partition.in_(partitions))
    query = query.order_by(PartitionOffsets.topic, PartitionOffsets.partition)
    result = await connection.execute(query)
    return [
        StoredPartition(
            row.topic,
            row.partition,
            _state_from_row(
                row.stable_offset,
                row.ic_ranges,
                row.wm_starts,
                row.wm_ends,
                row.wm_offsets,
                row.metadata,
            ),
        )
        for row in result
    ]


async def lock_existing_partitions(
    connection: AsyncConnection, group_id: str, topic: str, partitions: Sequence[int] | None
) -> dict[TopicPartitionKey, CommittedOffsets]:
    """Lock the stored rows of one topic (all, or some partitions) for an admin change."""
    query = (
        select(*_STATE_COLUMNS)
        .where(PartitionOffsets.group_id == group_id, PartitionOffsets.topic == topic)
        .order_by(PartitionOffsets.partition)
        .with_for_update()
    )
    if partitions:
        query = query.where(PartitionOffsets.partition.in_(partitions))
    result = await connection.execute(query)
    return {
        (row.topic, row.partition): _state_from_row(
            row.stable_offset,
            row.ic_ranges,
            row.wm_starts,
            row.wm_ends,
            row.wm_offsets,
            row.metadata,
        )
        for row in result
    }


async def delete_offsets(connection: AsyncConnection, group_id: str, topic: str | None) -> int:
    statement = delete(PartitionOffsets).where(PartitionOffsets.group_id == group_id)
    if topic is not None:
        statement = statement.where(PartitionOffsets.topic == topic)
    result = await connection.execute(statement)
    return int(result.rowcount or 0)
