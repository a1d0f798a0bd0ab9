"""All SQL of the offset store.

A commit costs two statements whatever it carries, because at 64 concurrent committers the
coordinator's CPU goes into per-statement work (driver, SQLAlchemy, round trips), not into
the offset algebra: one statement creates the group if needed, reads the switch, runs the
membership fence and locks (creating missing rows) and reads every partition row of the
request; one ``UPDATE ... FROM unnest`` writes the changed rows back. Rows are always locked
in (topic, partition) order, after the group or member row, so concurrent multi-partition
commits cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Generic, TypeVar

import asyncpg
from sqlalchemy import bindparam, delete, select, text
from sqlalchemy.dialects.postgresql import ARRAY, Range
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Integer, Text

from client.committed import CommittedOffsets
from coordinator.db.models import PartitionOffsets
from coordinator.groups.fencing import MEMBER_FENCE, STANDALONE_FENCE, CommitFence

TopicPartitionKey = tuple[str, int]
FenceKey = TypeVar("FenceKey")
FenceFacts = TypeVar("FenceFacts")

_STATE_RETURNING = """
    RETURNING topic, partition, stable_offset, ic_ranges, wm_starts, wm_ends, wm_offsets,
              metadata
"""

_LOCK_ROWS = text(
    """
    INSERT INTO partition_offsets (group_id, topic, partition)
    SELECT :group_id, t, p FROM unnest(:topics, :partitions) AS requested(t, p)
    ON CONFLICT (group_id, topic, partition)
    DO UPDATE SET stable_offset = partition_offsets.stable_offset
    """
    + _STATE_RETURNING
).bindparams(
    bindparam("topics", type_=ARRAY(Text)),
    bindparam("partitions", type_=ARRAY(Integer)),
)


# The partition rows are inserted and locked only once the switch and the fence passed (the
# scalar subquery on ``checks`` also makes the group and member locks come first). A group
# created by another transaction after this statement's snapshot is neither ``created`` nor
# seen: membership was not read, and the caller checks it again in a statement of its own.
_COMMIT_LOCK_TEMPLATE = """
    WITH created AS (
        INSERT INTO groups (group_id) VALUES (:group_id) ON CONFLICT (group_id) DO NOTHING
        RETURNING group_id
    ),
    {fence},
    checks AS (
        SELECT (SELECT accept_individual_commit FROM coordinator_config WHERE id = 1)
                   AS stored_switch,
               EXISTS (SELECT FROM created) AS created,
               EXISTS (SELECT FROM groups WHERE group_id = :group_id) AS group_seen,
               (SELECT passed FROM fence) AS passed,
               (SELECT live_members FROM fence) AS live_members,
               (SELECT member_epoch FROM fence) AS member_epoch,
               (SELECT alive FROM fence) AS alive
    ),
    locked AS (
        INSERT INTO partition_offsets (group_id, topic, partition)
        SELECT :group_id, t, p FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]))
            AS requested(t, p)
        WHERE (SELECT (NOT :individual OR coalesce(stored_switch, :default_switch))
                      AND coalesce(passed, created AND :standalone)
               FROM checks)
        ON CONFLICT (group_id, topic, partition)
        DO UPDATE SET stable_offset = partition_offsets.stable_offset
        {returning}
    )
    SELECT checks.*, locked.* FROM checks LEFT JOIN locked ON true
"""

_LOCK_FOR_COMMIT = {
    standalone: text(_COMMIT_LOCK_TEMPLATE.format(fence=fence, returning=_STATE_RETURNING))
    for standalone, fence in ((True, STANDALONE_FENCE), (False, MEMBER_FENCE))
}

# New states travel as text literals of their column types: one flat array per column keeps
# the whole write one statement, and formatting integers is cheaper than per-element binding.
_WRITE_ROWS = text(
    """
    UPDATE partition_offsets AS stored
    SET stable_offset = new.stable_offset,
        ic_ranges = CAST(new.ic_ranges AS int8multirange),
        wm_starts = CAST(new.wm_starts AS bigint[]),
        wm_ends = CAST(new.wm_ends AS bigint[]),
        wm_offsets = CAST(new.wm_offsets AS bigint[]),
        metadata = new.metadata,
        updated_at = now()
    FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]),
                CAST(:stable_offsets AS bigint[]), CAST(:ic_ranges AS text[]),
                CAST(:wm_starts AS text[]), CAST(:wm_ends AS text[]),
                CAST(:wm_offsets AS text[]), CAST(:metadata AS text[]))
        AS new(topic, partition, stable_offset, ic_ranges, wm_starts, wm_ends, wm_offsets,
               metadata)
    WHERE stored.group_id = :group_id
      AND stored.topic = new.topic AND stored.partition = new.partition
    """
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
class CommitLock:
    """What a commit's locking statement found.

    ``states`` holds the locked rows, and is filled only when the switch and the fence let
    the commit through. ``membership_read`` is False when the group row appeared after the
    statement's snapshot, so neither the fence nor the rows were read.
    """

    stored_switch: bool | None
    membership_read: bool
    fence: CommitFence | None
    states: dict[TopicPartitionKey, CommittedOffsets]


@dataclass(frozen=True)
class StoredPartition:
    topic: str
    partition: int
    state: CommittedOffsets


def _ranges_from_db(ranges: Sequence[Range[int]]) -> tuple[tuple[int, int], ...]:
    # Postgres returns canonical half-open int8 ranges [lower, upper).
    return tuple((r.lower, r.upper - 1) for r in ranges if r.lower is not None and r.upper)


def _state_of(row: Any) -> CommittedOffsets:
    """A stored row (any query selecting the state columns) as the algebra's value."""
    return CommittedOffsets.of_pieces(
        row.stable_offset,
        _ranges_from_db(row.ic_ranges),
        tuple(zip(row.wm_starts, row.wm_ends, row.wm_offsets, strict=True)),
        row.metadata,
    )


async def lock_for_commit(
    connection: AsyncConnection,
    group_id: str,
    member_id: str | None,
    member_epoch: int | None,
    keys: Sequence[TopicPartitionKey],
    individual: bool,
    default_switch: bool,
) -> CommitLock:
    """Create the group if new, read the switch, fence the committer and lock ``keys``.

    ``individual``: the commit carries ranges or watermarks, which the switch may refuse;
    ``default_switch`` stands in for a switch not stored yet.
    """
    ordered = sorted(keys)
    standalone = member_id is None
    parameters = {
        "group_id": group_id,
        "topics": [topic for topic, _ in ordered],
        "partitions": [partition for _, partition in ordered],
        "individual": individual,
        "default_switch": default_switch,
        "standalone": standalone,
    }
    if not standalone:
        parameters["member_id"] = member_id
        parameters["member_epoch"] = member_epoch
    rows = (await connection.execute(_LOCK_FOR_COMMIT[standalone], parameters)).all()
    checks = rows[0]
    fence = (
        None
        if checks.passed is None
        else CommitFence(checks.passed, checks.live_members, checks.member_epoch, checks.alive)
    )
    states = {(row.topic, row.partition): _state_of(row) for row in rows if row.topic is not None}
    return CommitLock(
        stored_switch=checks.stored_switch,
        membership_read=checks.created or checks.group_seen,
        fence=fence,
        states=states,
    )


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
    return {(row.topic, row.partition): _state_of(row) for row in result}


def _bigint_array(values: Sequence[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def _multirange_literal(ranges: Sequence[tuple[int, int]]) -> str:
    return "{" + ",".join(f"[{start},{end}]" for start, end in ranges) + "}"


# The state columns of the write statements, in their parameters' order.
_STATE_PARAMETERS = (
    "stable_offsets",
    "ic_ranges",
    "wm_starts",
    "wm_ends",
    "wm_offsets",
    "metadata",
)


def _state_columns(states: Sequence[CommittedOffsets]) -> tuple[list[Any], ...]:
    """New states as one flat array per column, in ``_STATE_PARAMETERS`` order."""
    return (
        [state.stable_offset for state in states],
        [_multirange_literal(state.ranges) for state in states],
        [_bigint_array([start for start, _, _ in state.pieces]) for state in states],
        [_bigint_array([end for _, end, _ in state.pieces]) for state in states],
        [_bigint_array([offset for _, _, offset in state.pieces]) for state in states],
        [state.metadata for state in states],
    )


async def write_partitions(
    connection: AsyncConnection, group_id: str, states: dict[TopicPartitionKey, CommittedOffsets]
) -> None:
    """Store ``states`` into rows the caller has locked."""
    if not states:
        return
    ordered = sorted(states.items())
    await connection.execute(
        _WRITE_ROWS,
        {
            "group_id": group_id,
            "topics": [topic for (topic, _), _ in ordered],
            "partitions": [partition for (_, partition), _ in ordered],
            **dict(zip(_STATE_PARAMETERS, _state_columns([s for _, s in ordered]), strict=True)),
        },
    )


# Batched commits (coordinator.offsets.batching) run on the driver connection: at the rates
# batching is for, SQLAlchemy's per-statement work would cost more than the statements.
# Every statement takes its rows in sorted order and the statements run groups, then members,
# then partitions, the order every other transaction locks them in.

GroupPartitionKey = tuple[str, str, int]

# Read along with the fence rows, to save a round trip per batch.
_SWITCH = "SELECT accept_individual_commit FROM coordinator_config WHERE id = 1"

_BATCH_LOCK_GROUPS = f"""
    WITH created AS (
        INSERT INTO groups (group_id)
        SELECT g FROM unnest($1::text[]) AS requested(g) ORDER BY g
        ON CONFLICT (group_id) DO NOTHING
        RETURNING group_id
    ),
    locked AS (
        SELECT group_id FROM groups WHERE group_id = ANY($1::text[])
        ORDER BY group_id FOR SHARE
    )
    SELECT group_id, 0::bigint AS live_members, ({_SWITCH}) AS stored_switch FROM created
    UNION ALL
    SELECT locked.group_id,
           (SELECT count(*) FROM members m
            WHERE m.group_id = locked.group_id AND m.expires_at > now()),
           ({_SWITCH})
    FROM locked
"""

_BATCH_LOCK_MEMBERS = f"""
    SELECT m.group_id, m.member_id, m.member_epoch, m.previous_member_epoch,
           m.expires_at > now() AS alive, ({_SWITCH}) AS stored_switch
    FROM members m
    JOIN unnest($1::text[], $2::text[]) AS requested(group_id, member_id)
      ON m.group_id = requested.group_id AND m.member_id = requested.member_id
    ORDER BY m.group_id, m.member_id
    FOR SHARE OF m
"""


_BATCH_LOCK_PARTITIONS = """
    SELECT stored.group_id, stored.topic, stored.partition, stored.stable_offset,
           stored.ic_ranges, stored.wm_starts, stored.wm_ends, stored.wm_offsets, stored.metadata
    FROM partition_offsets stored
    JOIN unnest($1::text[], $2::text[], $3::int[]) AS requested(group_id, topic, partition)
      ON stored.group_id = requested.group_id AND stored.topic = requested.topic
         AND stored.partition = requested.partition
    ORDER BY stored.group_id, stored.topic, stored.partition
    FOR UPDATE OF stored
"""

_BATCH_CREATE_PARTITIONS = """
    INSERT INTO partition_offsets (group_id, topic, partition)
    SELECT g, t, p FROM unnest($1::text[], $2::text[], $3::int[]) AS requested(g, t, p)
    ORDER BY g, t, p
    ON CONFLICT (group_id, topic, partition) DO NOTHING
"""

_BATCH_WRITE_PARTITIONS = """
    UPDATE partition_offsets AS stored
    SET stable_offset = new.stable_offset,
        ic_ranges = new.ic_ranges::int8multirange,
        wm_starts = new.wm_starts::bigint[],
        wm_ends = new.wm_ends::bigint[],
        wm_offsets = new.wm_offsets::bigint[],
        metadata = new.metadata,
        updated_at = now()
    FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::text[], $6::text[],
                $7::text[], $8::text[], $9::text[])
        AS new(group_id, topic, partition, stable_offset, ic_ranges, wm_starts, wm_ends,
               wm_offsets, metadata)
    WHERE stored.group_id = new.group_id
      AND stored.topic = new.topic AND stored.partition = new.partition
"""


@dataclass(frozen=True)
class MemberFenceRow:
    member_epoch: int
    previous_member_epoch: int
    alive: bool


@dataclass(frozen=True)
class FenceRows(Generic[FenceKey, FenceFacts]):
    """Fence facts by subject, and ``accept.individual.commit`` as stored, read in one go.

    ``switch_read`` is False when no subject was found, so the switch was not read either.
    """

    facts: dict[FenceKey, FenceFacts]
    stored_switch: bool | None
    switch_read: bool


def _fence_rows(rows: Sequence[asyncpg.Record], key: Any, facts: Any) -> FenceRows[Any, Any]:
    return FenceRows(
        {key(row): facts(row) for row in rows},
        rows[0]["stored_switch"] if rows else None,
        bool(rows),
    )


async def batch_lock_groups(
    connection: asyncpg.Connection, group_ids: Collection[str]
) -> FenceRows[str, int]:
    """Create missing groups and lock them FOR SHARE: group id -> live members.

    A group created by another transaction after this statement's snapshot is absent from
    the answer although it exists; the caller treats its requests as not decided here.
    """
    if not group_ids:
        return FenceRows({}, None, switch_read=False)
    rows = await connection.fetch(_BATCH_LOCK_GROUPS, sorted(group_ids))
    return _fence_rows(rows, itemgetter("group_id"), lambda row: int(row["live_members"]))


async def batch_lock_members(
    connection: asyncpg.Connection, members: Collection[tuple[str, str]]
) -> FenceRows[tuple[str, str], MemberFenceRow]:
    """Lock the committing members' rows FOR SHARE: (group id, member id) -> fence facts."""
    if not members:
        return FenceRows({}, None, switch_read=False)
    ordered = sorted(members)
    rows = await connection.fetch(
        _BATCH_LOCK_MEMBERS, [group for group, _ in ordered], [member for _, member in ordered]
    )
    return _fence_rows(
        rows,
        itemgetter("group_id", "member_id"),
        lambda row: MemberFenceRow(row["member_epoch"], row["previous_member_epoch"], row["alive"]),
    )


async def batch_read_switch(connection: asyncpg.Connection) -> bool | None:
    value = await connection.fetchval(_SWITCH)
    return None if value is None else bool(value)


def _state_of_record(record: asyncpg.Record) -> CommittedOffsets:
    return CommittedOffsets.of_pieces(
        record["stable_offset"],
        _ranges_from_db(record["ic_ranges"]),
        tuple(zip(record["wm_starts"], record["wm_ends"], record["wm_offsets"], strict=True)),
        record["metadata"],
    )


async def _batch_lock_existing(
    connection: asyncpg.Connection, ordered: Sequence[GroupPartitionKey]
) -> dict[GroupPartitionKey, CommittedOffsets]:
    rows = await connection.fetch(
        _BATCH_LOCK_PARTITIONS,
        [key[0] for key in ordered],
        [key[1] for key in ordered],
        [key[2] for key in ordered],
    )
    return {
        (row["group_id"], row["topic"], row["partition"]): _state_of_record(row) for row in rows
    }


async def batch_lock_partitions(
    connection: asyncpg.Connection, keys: Sequence[GroupPartitionKey]
) -> dict[GroupPartitionKey, CommittedOffsets]:
    """Lock the rows of ``keys`` FOR UPDATE, creating the missing ones, and read their state.

    Existing rows are locked without writing them (no new row versions); rows that do not
    exist yet, which only a partition's first commits meet, are inserted and then locked.
    """
    ordered = sorted(set(keys))
    states = await _batch_lock_existing(connection, ordered)
    missing = [key for key in ordered if key not in states]
    if missing:
        await connection.execute(
            _BATCH_CREATE_PARTITIONS,
            [key[0] for key in missing],
            [key[1] for key in missing],
            [key[2] for key in missing],
        )
        states.update(await _batch_lock_existing(connection, missing))
    return states


async def batch_write_partitions(
    connection: asyncpg.Connection, states: dict[GroupPartitionKey, CommittedOffsets]
) -> None:
    """Store ``states`` into rows the caller has locked."""
    if not states:
        return
    ordered = sorted(states.items())
    await connection.execute(
        _BATCH_WRITE_PARTITIONS,
        [key[0] for key, _ in ordered],
        [key[1] for key, _ in ordered],
        [key[2] for key, _ in ordered],
        *_state_columns([state for _, state in ordered]),
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
            _state_of(row),
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
    return {(row.topic, row.partition): _state_of(row) for row in result}


async def delete_offsets(connection: AsyncConnection, group_id: str, topic: str | None) -> int:
    statement = delete(PartitionOffsets).where(PartitionOffsets.group_id == group_id)
    if topic is not None:
        statement = statement.where(PartitionOffsets.topic == topic)
    result = await connection.execute(statement)
    return int(result.rowcount or 0)
