"""All SQL of the offset store: the commit statements, and the reads and admin changes.

A transaction of commits (coordinator.offsets.batching: one or many requests) costs three
statements and three round trips in the common case whatever it carries, because at 64
concurrent committers the coordinator's CPU and the database go into per-statement work
(driver calls, round trips), not into the offset algebra: ``BEGIN``; one statement
(``lock_batch``) that locks the standalone commits' groups and the committing members' rows,
reads the switch, and locks and reads every partition row the requests name; one
``UPDATE ... FROM unnest`` that writes the changed rows back, sent with the ``COMMIT``
(``write_and_commit``). A group's or a partition's first commit adds the statements of its
cap (``coordinator.db.quotas``) and two more (insert the missing rows, lock them). Rows are
always locked in sorted order, groups, then members, then partitions, so concurrent commits
cannot deadlock with each other or with heartbeats. ``tests/offsets/test_commit_statements.py``
counts them (docs/offsets.md, "Statements per batch"). ``lock_committers``, ``lock_existing``
and ``write_partitions`` are the same steps one at a time, for the resets (offsets past the log
end, the admin's), which run inside a SQLAlchemy transaction.

A stored state is decoded by ``states_of`` or ``_locked_state_of`` when the commit path read it
(the IC ranges as text) and by ``_state_of`` when SQLAlchemy did (the reads and admin changes).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from client.protocol.committed import CommittedOffsets
from coordinator.core.fence import MemberStanding
from coordinator.db.models import PartitionOffsets
from coordinator.db.switches import STORED_SWITCH
from coordinator.offsets import literals
from coordinator.offsets.pacing import PARTITIONS_PER_TURN

TopicPartitionKey = tuple[str, int]
GroupPartitionKey = literals.GroupPartitionKey

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


def _ranges_from_db(ranges: Sequence[Any]) -> tuple[tuple[int, int], ...]:
    # Postgres returns canonical half-open int8 ranges [lower, upper).
    return tuple((r.lower, r.upper - 1) for r in ranges if r.lower is not None and r.upper)


class _Row(Protocol):
    """A row by column name: an asyncpg ``Record`` or a SQLAlchemy ``RowMapping``."""

    def __getitem__(self, column: str, /) -> Any: ...


def _state_of(row: _Row) -> CommittedOffsets:
    """A stored row, read by SQLAlchemy (the reads and admin changes), as the algebra's value."""
    return CommittedOffsets.of_pieces(
        row["stable_offset"],
        _ranges_from_db(row["ic_ranges"]),
        tuple(zip(row["wm_starts"], row["wm_ends"], row["wm_offsets"], strict=True)),
        row["metadata"],
    )


def _locked_state_of(row: asyncpg.Record) -> CommittedOffsets:
    """A row of ``_LOCK_PARTITIONS`` (columns by position) as the algebra's value."""
    return CommittedOffsets.of_pieces(
        row[3],
        literals.ranges_from_text(row[4]),
        tuple(zip(row[5], row[6], row[7], strict=True)),
        row[8],
    )


class WrittenStates:
    """The state a batcher last wrote to each row, so a row read back unchanged is not decoded
    again (decoding a small state cost about as much as the algebra's work on it). A row is
    taken from here only when its state's text (``_STATE_TEXT``) and its metadata equal what
    was written, so a row someone else wrote since (an admin reset, another coordinator), or
    a write whose transaction failed, is decoded as usual. Forgets everything past
    ``capacity`` rows, to stay bounded."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._states: dict[GroupPartitionKey, tuple[str, CommittedOffsets]] = {}
        self._capacity = capacity

    def remember(
        self,
        keys: Sequence[GroupPartitionKey],
        state_texts: Sequence[str],
        states: Sequence[CommittedOffsets],
    ) -> None:
        """The states a batch wrote, with their text, key by key."""
        if len(self._states) + len(keys) > self._capacity:
            self._states.clear()
        self._states.update(zip(keys, zip(state_texts, states, strict=True), strict=True))

    def of_row(self, key: GroupPartitionKey, row: asyncpg.Record) -> CommittedOffsets | None:
        """The state of a ``lock_batch`` row, if it is the one last written to it."""
        known = self._states.get(key)
        if known is None or row[6] != known[0] or row[7] != known[1].metadata:
            return None
        return known[1]


# The commit statements run on the driver connection: at the rates commits come, SQLAlchemy's
# per-statement work would cost more than the statements. Every statement takes its rows in
# sorted order, and they run groups, then members, then partitions: the order every other
# transaction locks them in.
#
# Arrays travel as one text literal each (``$1::text::text[]``): asyncpg checks every element
# of an array parameter against three abstract base classes, which cost more client CPU than
# the rest of the statement, while Postgres parses a literal in C. For the same reason the IC
# ranges come back in their (canonical) text form: binary decoding builds an asyncpg ``Range``
# per range.

# The switch is read along with the fence rows, to save a round trip per batch. Groups are
# only locked here: a commit creates its group once it is admitted (coordinator.db.quotas).
_LOCK_GROUPS = f"""
    WITH locked AS (
        SELECT group_id FROM groups WHERE group_id = ANY($1::text::text[])
        ORDER BY group_id FOR SHARE
    )
    SELECT locked.group_id,
           (SELECT count(*) FROM members m
            WHERE m.group_id = locked.group_id AND m.expires_at > now()) AS live_members,
           ({STORED_SWITCH}) AS stored_switch
    FROM locked
"""

_LOCK_MEMBERS = f"""
    SELECT m.group_id, m.member_id, m.member_epoch, m.previous_member_epoch,
           m.expires_at > now() AS alive, ({STORED_SWITCH}) AS stored_switch
    FROM members m
    JOIN unnest($1::text::text[], $2::text::text[]) AS requested(group_id, member_id)
      ON m.group_id = requested.group_id AND m.member_id = requested.member_id
    ORDER BY m.group_id, m.member_id
    FOR SHARE OF m
"""

_LOCK_PARTITIONS = """
    SELECT stored.group_id, stored.topic, stored.partition, stored.stable_offset,
           stored.ic_ranges::text, stored.wm_starts, stored.wm_ends, stored.wm_offsets,
           stored.metadata
    FROM partition_offsets stored
    JOIN unnest($1::text::text[], $2::text::text[], $3::text::int[])
        AS requested(group_id, topic, partition)
      ON stored.group_id = requested.group_id AND stored.topic = requested.topic
         AND stored.partition = requested.partition
    ORDER BY stored.group_id, stored.topic, stored.partition
    FOR UPDATE OF stored
"""

_CREATE_PARTITIONS = """
    INSERT INTO partition_offsets (group_id, topic, partition)
    SELECT g, t, p FROM unnest($1::text::text[], $2::text::text[], $3::text::int[])
        AS requested(g, t, p)
    ORDER BY g, t, p
    ON CONFLICT (group_id, topic, partition) DO NOTHING
"""

# New states travel as text literals of their column types, one array literal per column:
# one statement for the whole write, and no per-element binding (above).
_WRITE_PARTITIONS = """
    UPDATE partition_offsets AS stored
    SET stable_offset = new.stable_offset,
        ic_ranges = new.ic_ranges::int8multirange,
        wm_starts = new.wm_starts::bigint[],
        wm_ends = new.wm_ends::bigint[],
        wm_offsets = new.wm_offsets::bigint[],
        metadata = new.metadata,
        updated_at = now()
    FROM unnest($1::text::text[], $2::text::text[], $3::text::int[], $4::text::bigint[],
                $5::text::text[], $6::text::text[], $7::text::text[], $8::text::text[],
                $9::text::text[])
        AS new(group_id, topic, partition, stable_offset, ic_ranges, wm_starts, wm_ends,
               wm_offsets, metadata)
    WHERE stored.group_id = new.group_id
      AND stored.topic = new.topic AND stored.partition = new.partition
"""


# A partition row's state (all but the metadata) as one text, in Postgres' own output of each
# column: ``stable|{[a,b),...}|{starts}|{ends}|{offsets}``. The write's literals are that same
# text (``coordinator.offsets._literals``), so a row read back unchanged is recognised by one
# string comparison (``WrittenStates``), and a row that is not is decoded from it
# (``literals.state_of_text``). None of the columns is NULL, and no column's text holds a
# ``|``.
_STATE_TEXT = "concat_ws('|', p.stable_offset, p.ic_ranges, p.wm_starts, p.wm_ends, p.wm_offsets)"

# A batch's one reading statement: the fence's facts, the switch and the partition rows, with
# every lock, in one round trip. ``UNION ALL`` runs its branches one after the other, so the
# locks are still taken groups, then members, then partitions. It locks the rows of every
# request of the batch, refused or not: a refused request's rows are read, never written, and
# their locks end with the transaction. A member's liveness is judged at the statement's
# start, not the transaction's: the previous batch on the connection may have begun the
# transaction with its ``COMMIT`` (``write_and_commit``). Columns by branch (``kind``): 0 a group
# (``number``: its live members), 1 a member (``number``, ``previous``: its epochs, ``flag``:
# alive), 2 the switch (``flag``), 3 a partition row (``number``: the partition, ``state``:
# its state as ``_STATE_TEXT``, and its ``metadata``).
_LOCK_BATCH = f"""
    SELECT 0 AS kind, g.group_id, NULL::text AS name,
           (SELECT count(*) FROM members m
            WHERE m.group_id = g.group_id AND m.expires_at > statement_timestamp()) AS number,
           NULL::bigint AS previous, NULL::bool AS flag, NULL::text AS state,
           NULL::text AS metadata
    FROM (SELECT group_id FROM groups WHERE group_id = ANY($1::text::text[])
          ORDER BY group_id FOR SHARE) AS g
    UNION ALL
    SELECT 1, m.group_id, m.member_id, m.member_epoch, m.previous_member_epoch,
           m.expires_at > statement_timestamp(), NULL, NULL
    FROM (SELECT m.group_id, m.member_id, m.member_epoch, m.previous_member_epoch, m.expires_at
          FROM members m
          JOIN unnest($2::text::text[], $3::text::text[]) AS requested(group_id, member_id)
            ON m.group_id = requested.group_id AND m.member_id = requested.member_id
          ORDER BY m.group_id, m.member_id
          FOR SHARE OF m) AS m
    UNION ALL
    SELECT 2, NULL, NULL, NULL, NULL, ({STORED_SWITCH}), NULL, NULL
    UNION ALL
    SELECT 3, p.group_id, p.topic, p.partition, NULL, NULL, {_STATE_TEXT}, p.metadata
    FROM (SELECT stored.group_id, stored.topic, stored.partition, stored.stable_offset,
                 stored.ic_ranges, stored.wm_starts, stored.wm_ends, stored.wm_offsets,
                 stored.metadata
          FROM partition_offsets stored
          JOIN unnest($4::text::text[], $5::text::text[], $6::text::int[])
              AS requested(group_id, topic, partition)
            ON stored.group_id = requested.group_id AND stored.topic = requested.topic
               AND stored.partition = requested.partition
          ORDER BY stored.group_id, stored.topic, stored.partition
          FOR UPDATE OF stored) AS p
"""

# The batch's write and its ``COMMIT`` in one simple-protocol message, so one round trip ends
# the transaction. The write is a statement prepared once per connection (``PREPARE``, which
# outlives a rolled-back transaction), so Postgres plans it once rather than per batch, and
# its parameters, text literals already, are sent as escaped string constants
# (``literals.sql_constant``). If the write fails, Postgres skips the ``COMMIT`` and the
# transaction is rolled back as any failed batch's.
_WRITE_NAME = "keyrange_write_partitions"
_PREPARE_WRITE = f"PREPARE {_WRITE_NAME} ({', '.join(['text'] * 9)}) AS {_WRITE_PARTITIONS}"
_WRITE_AND_COMMIT = f"EXECUTE {_WRITE_NAME} ({{}});\nCOMMIT;"
# The driver connections the write is prepared on; one that closes leaves this set.
_PREPARED: weakref.WeakSet[asyncpg.Connection] = weakref.WeakSet()


@dataclass(frozen=True)
class Committers:
    """The fence facts of a batch's committers, read under the locks that keep them true.

    ``live_members``: the live member count of each group a standalone commit names; a group
    that does not exist (or was created by another transaction after the statement's
    snapshot) is absent. ``standings``: each
    committing member's row, absent when there is none. ``stored_switch``: the stored
    ``accept.individual.commit``, None when not stored yet.
    """

    live_members: dict[str, int]
    standings: dict[tuple[str, str], MemberStanding]
    stored_switch: bool | None


async def lock_committers(
    connection: asyncpg.Connection,
    standalone_groups: Collection[str],
    members: Collection[tuple[str, str]],
) -> Committers:
    """Lock the standalone commits' groups and the committing members' rows FOR SHARE, and
    read the switch, in two statements at most (the switch rides along with the locks, or
    comes alone when the batch found no subject)."""
    live_members: dict[str, int] = {}
    standings: dict[tuple[str, str], MemberStanding] = {}
    switch_rows: list[asyncpg.Record] = []
    if standalone_groups:
        rows = await connection.fetch(_LOCK_GROUPS, literals.text_array(sorted(standalone_groups)))
        live_members = {row["group_id"]: int(row["live_members"]) for row in rows}
        switch_rows += rows[:1]
    if members:
        ordered = sorted(members)
        rows = await connection.fetch(
            _LOCK_MEMBERS,
            literals.text_array([group for group, _ in ordered]),
            literals.text_array([member for _, member in ordered]),
        )
        standings = {
            (row["group_id"], row["member_id"]): MemberStanding(
                row["member_epoch"], row["previous_member_epoch"], row["alive"]
            )
            for row in rows
        }
        switch_rows += rows[:1]
    if switch_rows:
        stored = switch_rows[0]["stored_switch"]
    else:  # no subject found: every request is refused, but the switch is judged first
        stored = await connection.fetchval(STORED_SWITCH)
    return Committers(live_members, standings, None if stored is None else bool(stored))


@dataclass(frozen=True)
class LockedBatch:
    """What a batch's reading statement found under its locks: the fence's facts, and the
    partition rows as read (decoded by ``states_of`` for the requests the fence admits)."""

    committers: Committers
    rows: dict[GroupPartitionKey, asyncpg.Record]


async def lock_batch(
    connection: asyncpg.Connection,
    standalone_groups: Collection[str],
    members: Collection[tuple[str, str]],
    keys: Collection[GroupPartitionKey],
) -> LockedBatch:
    """Lock the standalone commits' groups and the committing members' rows FOR SHARE, read
    the switch, and lock the partition rows of ``keys`` that exist FOR UPDATE, in one
    statement (``_LOCK_BATCH``)."""
    ordered_members = sorted(members)
    rows = await connection.fetch(
        _LOCK_BATCH,
        literals.text_array(sorted(standalone_groups)),
        literals.text_array([group for group, _ in ordered_members]),
        literals.text_array([member for _, member in ordered_members]),
        *literals.key_arrays(sorted(keys)),
    )
    live_members: dict[str, int] = {}
    standings: dict[tuple[str, str], MemberStanding] = {}
    stored: bool | None = None
    partitions: dict[GroupPartitionKey, asyncpg.Record] = {}
    for row in rows:
        kind = row[0]
        if kind == 3:
            partitions[(row[1], row[2], row[3])] = row
        elif kind == 0:
            live_members[row[1]] = row[3]
        elif kind == 1:
            standings[(row[1], row[2])] = MemberStanding(row[3], row[4], row[5])
        else:
            stored = row[5]
    return LockedBatch(Committers(live_members, standings, stored), partitions)


async def states_of(
    rows: Mapping[GroupPartitionKey, asyncpg.Record],
    keys: Iterable[GroupPartitionKey],
    written: WrittenStates,
) -> dict[GroupPartitionKey, CommittedOffsets]:
    """The stored states of ``keys`` among ``rows`` of ``lock_batch``, taken from ``written``
    or decoded, a turn at a time (``coordinator.offsets.pacing``)."""
    wanted = [key for key in keys if key in rows]
    states: dict[GroupPartitionKey, CommittedOffsets] = {}
    of_row = written.of_row
    for start in range(0, len(wanted), PARTITIONS_PER_TURN):
        if start:
            await asyncio.sleep(0)
        for key in wanted[start : start + PARTITIONS_PER_TURN]:
            row = rows[key]
            states[key] = of_row(key, row) or literals.state_of_text(row[6], row[7])
    return states


async def lock_existing(
    connection: asyncpg.Connection, keys: Collection[GroupPartitionKey]
) -> dict[GroupPartitionKey, CommittedOffsets]:
    """Lock the rows of ``keys`` that exist FOR UPDATE, without writing them (no new row
    versions), and read their state, decoded a turn at a time (``coordinator.offsets.pacing``)."""
    rows = await connection.fetch(_LOCK_PARTITIONS, *literals.key_arrays(sorted(set(keys))))
    states: dict[GroupPartitionKey, CommittedOffsets] = {}
    for start in range(0, len(rows), PARTITIONS_PER_TURN):
        if start:
            await asyncio.sleep(0)
        for row in rows[start : start + PARTITIONS_PER_TURN]:
            states[(row[0], row[1], row[2])] = _locked_state_of(row)
    return states


async def create_partitions(
    connection: asyncpg.Connection, keys: Collection[GroupPartitionKey]
) -> dict[GroupPartitionKey, CommittedOffsets]:
    """Insert the rows of ``keys`` that are missing, which only a partition's first commits
    meet, then lock and read them all."""
    ordered = sorted(set(keys))
    await connection.execute(_CREATE_PARTITIONS, *literals.key_arrays(ordered))
    return await lock_existing(connection, ordered)


async def write_partitions(
    connection: asyncpg.Connection, states: Mapping[GroupPartitionKey, CommittedOffsets]
) -> None:
    """Store ``states`` into rows the caller has locked; their columns are formatted a turn
    at a time (``coordinator.offsets.pacing``)."""
    if states:
        parameters, _, _, _ = await literals.write_literals(states)
        await connection.execute(_WRITE_PARTITIONS, *parameters)


async def write_and_commit(
    connection: asyncpg.Connection,
    states: Mapping[GroupPartitionKey, CommittedOffsets],
    written: WrittenStates,
    then_begin: bool = False,
) -> None:
    """Store ``states`` as ``write_partitions`` does and commit the transaction, in one round
    trip, and remember them in ``written``; or only commit, when nothing changed. With
    ``then_begin`` the same message opens the next transaction (the caller has one to run)."""
    begin = "\nBEGIN;" if then_begin else ""
    if not states:
        await connection.execute("COMMIT;" + begin)
        return
    parameters, ordered, ordered_states, state_texts = await literals.write_literals(states)
    if connection not in _PREPARED:
        try:
            await connection.execute(_PREPARE_WRITE)
        except asyncpg.DuplicatePreparedStatementError:
            # Prepared by a batch cancelled before it heard back: this batch fails and is
            # re-run, and the connection's next batches use what is there.
            _PREPARED.add(connection)
            raise
        _PREPARED.add(connection)
    await connection.execute(
        _WRITE_AND_COMMIT.format(", ".join(map(literals.sql_constant, parameters))) + begin
    )
    written.remember(ordered, state_texts, ordered_states)


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
        StoredPartition(row["topic"], row["partition"], _state_of(row)) for row in result.mappings()
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
    return {(row["topic"], row["partition"]): _state_of(row) for row in result.mappings()}


async def delete_offsets(connection: AsyncConnection, group_id: str, topic: str | None) -> int:
    statement = delete(PartitionOffsets).where(PartitionOffsets.group_id == group_id)
    if topic is not None:
        statement = statement.where(PartitionOffsets.topic == topic)
    result = await connection.execute(statement)
    return int(result.rowcount or 0)
