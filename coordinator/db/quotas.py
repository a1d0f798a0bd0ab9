"""The statements behind the per-tenant caps (``coordinator.core.quotas`` decides): count
what a tenant or a group holds under a lock that keeps the count true until the transaction
ends, and create groups. Commit batches and heartbeats both create groups, so both come here.

Counts are serialised with transaction-scoped advisory locks, one per tenant for groups and
one per group for partition rows, taken in sorted order and only when something would be
created: a commit to partitions that already exist takes none. They are taken after the
committers' row locks and before any partition row is inserted, the same order in every
transaction, so they add no lock cycle.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import asyncpg

# First halves of the two-key advisory locks, so Keyrange's locks never meet another
# application's on a shared database ("KRg" and "KRp").
_GROUPS_OF_SCOPE = 0x4B5267
_PARTITIONS_OF_GROUP = 0x4B5270

_LOCK = """
    SELECT count(pg_advisory_xact_lock($1::int, hashtext(k)))
    FROM (SELECT k FROM unnest($2::text[]) AS k ORDER BY k) AS ordered
"""

_GROUPS_PER_SCOPE = """
    SELECT s, (SELECT count(*) FROM groups WHERE starts_with(group_id, s)) AS stored
    FROM unnest($1::text[]) AS s
"""

_CREATE_GROUPS = """
    INSERT INTO groups (group_id)
    SELECT g FROM unnest($1::text[]) AS requested(g) ORDER BY g
    ON CONFLICT (group_id) DO NOTHING
    RETURNING group_id
"""

_PARTITIONS_PER_GROUP = """
    SELECT group_id, count(*) AS stored FROM partition_offsets
    WHERE group_id = ANY($1::text[]) GROUP BY group_id
"""


async def lock_scopes(connection: asyncpg.Connection, scopes: Collection[str]) -> dict[str, int]:
    """Lock group creation in ``scopes`` (group-id prefixes, "" for all groups) and count the
    groups each holds, in a statement after the lock so the count sees every group created
    by the transactions that held it before."""
    ordered = sorted(set(scopes))
    await connection.fetchval(_LOCK, _GROUPS_OF_SCOPE, ordered)
    rows = await connection.fetch(_GROUPS_PER_SCOPE, ordered)
    return {row["s"]: int(row["stored"]) for row in rows}


async def create_groups(connection: asyncpg.Connection, group_ids: Collection[str]) -> set[str]:
    """Insert groups; returns those this transaction created (the others exist already, or
    another transaction is creating them)."""
    rows = await connection.fetch(_CREATE_GROUPS, sorted(set(group_ids)))
    return {row["group_id"] for row in rows}


async def lock_partition_growth(
    connection: asyncpg.Connection, group_ids: Collection[str]
) -> Mapping[str, int]:
    """Lock adding partition rows to ``group_ids`` and count the rows each holds."""
    ordered = sorted(set(group_ids))
    await connection.fetchval(_LOCK, _PARTITIONS_OF_GROUP, ordered)
    rows = await connection.fetch(_PARTITIONS_PER_GROUP, ordered)
    return {row["group_id"]: int(row["stored"]) for row in rows}
