"""All SQL of group membership (what every locked heartbeat runs is built once, in
``coordinator.groups.statements``).

Serialisation: every change to a group's membership or assignments runs under that group's
row lock (``lock_group``), taken first in the transaction, so coordinator replicas sharing
one database take turns per group and never hold membership state of their own. The one
exception is ``renew_stable_sessions``: a heartbeat of a member with nothing to reconcile
only moves its own expiry, guarded so that it matches nothing the moment anything about the
member or its group changed (the caller then takes the locked path). The guard restates a
rule of the pure heartbeat step: its comparisons of the member's own fields are built from
the step's ``SENT_FIELDS``, and tests/groups/test_stable_guard.py holds the whole guard to the
step on generated cases.

Slices are decoded here, once, as rows are read, and encoded as they are written: the
records this module hands out carry normalized ``Slice`` tuples, and what it stores is the
canonical wire form, so stored JSONB compares by plain equality (the stable session's guard
relies on it).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import bindparam, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Text

from coordinator.core.assignment import Slice, slices_from_wire, slices_to_wire
from coordinator.core.heartbeat import SENT_FIELDS
from coordinator.core.membership import GroupRecord, MemberRecord
from coordinator.core.topic_pattern import matching_topics
from coordinator.db.models import (
    Member,
)
from coordinator.groups import statements

_CREATE_GROUP = text(
    "INSERT INTO groups (group_id) VALUES (:group_id) ON CONFLICT (group_id) DO NOTHING"
)

_GROUPS_TO_REAP = text(
    """
    SELECT g.group_id FROM groups g
    WHERE EXISTS (SELECT 1 FROM members m
                  WHERE m.group_id = g.group_id AND m.expires_at <= now())
    ORDER BY g.group_id
    LIMIT :limit
    FOR NO KEY UPDATE OF g SKIP LOCKED
    """
)

_REBALANCE_GROUPS = text(
    """
    UPDATE groups SET rebalance_requested = true, rebalance_reason = :reason
    WHERE group_id = ANY(:group_ids)
    """
).bindparams(bindparam("group_ids", type_=ARRAY(Text)))


# Offset retention (docs/quotas.md), as Kafka's offsets.retention.minutes: a group without
# member rows whose last member left (or which was created, if it never had one) and whose
# last stored commit are both older than the retention.
_IDLE_FOR_RETENTION = """
    coalesce(g.members_left_at, g.created_at) < now() - make_interval(mins => :minutes)
    AND NOT EXISTS (SELECT 1 FROM members m WHERE m.group_id = g.group_id)
    AND NOT EXISTS (SELECT 1 FROM partition_offsets p
                    WHERE p.group_id = g.group_id
                      AND p.updated_at >= now() - make_interval(mins => :minutes))
"""

# Locked first, skipping groups anyone is using (a join or a standalone commit holds the
# row), then deleted by a second statement whose fresh snapshot re-checks the condition: a
# commit or a member that made it in between is seen, and the group stays. Replicas running
# this at once split the groups between them.
_LOCK_EXPIRED_GROUPS = text(
    f"""
    SELECT g.group_id FROM groups g WHERE {_IDLE_FOR_RETENTION}
    ORDER BY g.group_id LIMIT :limit
    FOR UPDATE OF g SKIP LOCKED
    """
)

_DELETE_EXPIRED_GROUPS = text(
    f"""
    DELETE FROM groups g WHERE g.group_id = ANY(:group_ids) AND {_IDLE_FOR_RETENTION}
    RETURNING g.group_id
    """
).bindparams(bindparam("group_ids", type_=ARRAY(Text)))

_EXISTING_GROUPS = text("SELECT group_id FROM groups WHERE group_id = ANY(:group_ids)").bindparams(
    bindparam("group_ids", type_=ARRAY(Text))
)

# For a statement naming a member's row ``me`` and binding ``group_id`` and ``member_id``:
# what the group's other live members hold on the partitions of its target, as JSON, and the
# member's columns in ``statements.MEMBER_COLUMNS``' order.
HELD_BY_OTHERS_OF_ME = """(
    SELECT coalesce(jsonb_agg(held), '[]'::jsonb)
    FROM members o, LATERAL jsonb_array_elements(o.owned || o.assigned) AS held
    WHERE o.group_id = :group_id AND o.member_id <> :member_id AND o.expires_at > now()
      AND (held->>'topic', held->>'partition') IN (
          SELECT wanted->>'topic', wanted->>'partition'
          FROM jsonb_array_elements(me.target) AS wanted))"""
MY_COLUMNS = ", ".join(f"me.{column.name}" for column in statements.MEMBER_COLUMNS)

_REAP_AND_READ_MEMBER = text(
    f"""
    WITH expired AS (
        DELETE FROM members WHERE group_id = :group_id AND expires_at <= now()
        RETURNING member_id
    ),
    me AS (
        SELECT * FROM members
        WHERE group_id = :group_id AND member_id = :member_id AND expires_at > now()
    )
    SELECT ARRAY(SELECT member_id FROM expired) AS expired, {HELD_BY_OTHERS_OF_ME} AS held,
        {MY_COLUMNS}
    FROM (SELECT 1) AS one LEFT JOIN me ON true
    """
)

# The member's own fields a request may carry, each with its column's type: unchanged when
# absent or equal to what is stored (``coordinator.core.heartbeat.SENT_FIELDS``).
_SENT_COLUMNS = [(field.name, Member.__table__.c[field.name].type) for field in SENT_FIELDS]

# The common heartbeat, many members' at once: every condition under which renewing a
# member's session is all there is to do, per request of the batch (a NULL means "the request
# leaves this unchanged"). A member row another transaction has locked is skipped, not waited
# for: its group is changing, so that request takes the locked path, and a statement
# renewing several rows never waits for one lock while holding another.
_SENT_NAMES = "".join(f", {name}" for name, _ in _SENT_COLUMNS)
_SENT_UNCHANGED = "".join(
    f"          AND (s.{name} IS NULL OR m.{name} = s.{name})\n" for name, _ in _SENT_COLUMNS
)
# The statement's arrays, one element per request, in the order of its parameters, each
# with the SQL type of its elements.
_SQL_TYPES = {bool: "boolean", int: "integer", str: "text"}
_RENEWAL_ARRAYS = [
    ("group_ids", "text"),
    ("member_ids", "text"),
    ("member_epochs", "integer"),
    ("owned", "text"),
    ("check_subscription", "boolean"),
    ("topics", "text"),
    ("regex", "text"),
    *((name, _SQL_TYPES[column_type.python_type]) for name, column_type in _SENT_COLUMNS),
]
_UNNESTED = ", ".join(
    f"${position}::{sql_type}[]" for position, (_, sql_type) in enumerate(_RENEWAL_ARRAYS, start=1)
)
# Written for the driver, as commits are: SQLAlchemy's per-statement work (the execution
# context, a bind processor over every element of every array) cost more than the statement.
_RENEW_STABLE_SESSIONS = f"""
    WITH renewable AS (
        SELECT m.group_id, m.member_id, s.request
        FROM unnest({_UNNESTED})
             WITH ORDINALITY AS s(group_id, member_id, member_epoch, owned, check_subscription,
                                  topics, regex{_SENT_NAMES}, request)
        JOIN members m ON m.group_id = s.group_id AND m.member_id = s.member_id
        JOIN groups g ON g.group_id = m.group_id
        WHERE m.member_epoch = s.member_epoch AND m.expires_at > now()
          AND NOT g.rebalance_requested
          AND m.owned = m.assigned AND m.assigned = m.target
          AND (s.owned IS NULL OR m.owned = CAST(s.owned AS jsonb))
          AND (NOT s.check_subscription OR (
                m.subscribed_topics
                    = ARRAY(SELECT jsonb_array_elements_text(CAST(s.topics AS jsonb)))
                AND m.subscribed_topic_regex IS NOT DISTINCT FROM s.regex))
{_SENT_UNCHANGED}        FOR NO KEY UPDATE OF m SKIP LOCKED
    )
    UPDATE members m
    SET last_heartbeat = now(),
        expires_at = now() + m.session_timeout_ms * interval '1 millisecond'
    FROM renewable r
    WHERE m.group_id = r.group_id AND m.member_id = r.member_id
    RETURNING r.request, m.assigned::text, m.session_timeout_ms
    """


_NOTIFY = text("SELECT pg_notify(:channel, :notice)")

_SAVE_TARGETS = text(
    """
    UPDATE members m SET target = CAST(new.target AS jsonb)
    FROM unnest(:member_ids, :targets) AS new(member_id, target)
    WHERE m.group_id = :group_id AND m.member_id = new.member_id
    """
).bindparams(
    bindparam("member_ids", type_=ARRAY(Text)),
    bindparam("targets", type_=ARRAY(Text)),
)


@dataclass(frozen=True)
class StableHeartbeat:
    # As stored, JSON text: the reply passes it through without decoding it.
    assigned_json: str
    session_timeout_ms: int


@dataclass(frozen=True)
class Subscription:
    group_id: str
    topics: list[str]
    regex: str | None

    def covers(self, topics: Collection[str]) -> bool:
        """Whether a change to any of ``topics`` (their partition counts, their switches)
        changes what this subscription's group may be assigned."""
        return any(t in topics for t in self.topics) or (
            self.regex is not None and bool(matching_topics(self.regex, topics))
        )


def _group_from_row(row: Any) -> GroupRecord:
    return GroupRecord(
        group_id=row.group_id,
        assignor=row.assignor,
        group_epoch=int(row.group_epoch),
        rebalance_requested=bool(row.rebalance_requested),
        rebalance_reason=row.rebalance_reason,
    )


def member_from_row(row: Any) -> MemberRecord:
    # Positional: attribute access on rows costs more than the rest of this function.
    (
        group_id,
        member_id,
        instance_id,
        client_id,
        client_host,
        member_epoch,
        previous_member_epoch,
        subscribed_topics,
        subscribed_topic_regex,
        assignor,
        allow_individual_commit,
        session_timeout_ms,
        owned,
        assigned,
        target,
        joined_at,
        last_heartbeat,
        expires_at,
        standbys,
    ) = row
    return MemberRecord(
        group_id,
        member_id,
        instance_id,
        client_id,
        client_host,
        member_epoch,
        previous_member_epoch,
        tuple(subscribed_topics),
        subscribed_topic_regex,
        assignor,
        allow_individual_commit,
        session_timeout_ms,
        slices_from_wire(owned),
        slices_from_wire(assigned),
        slices_from_wire(target),
        joined_at,
        last_heartbeat,
        expires_at,
        slices_from_wire(standbys),
    )


async def lock_group(connection: AsyncConnection, group_id: str) -> GroupRecord:
    """Create the group if new and lock its row until the transaction ends: a plain row
    lock (``statements.FIND_GROUP_LOCKED``), not an upsert, since a lock that writes no new
    row version neither makes commits (which insert the group row if it is missing) wait for
    this transaction, nor, being NO KEY UPDATE, the foreign-key checks of rows that reference
    the group."""
    locked = {"group_id": group_id}
    row = (await connection.execute(statements.FIND_GROUP_LOCKED, locked)).one_or_none()
    if row is None:
        await connection.execute(_CREATE_GROUP, locked)
        row = (await connection.execute(statements.FIND_GROUP_LOCKED, locked)).one()
    return _group_from_row(row)


async def find_group(
    connection: AsyncConnection, group_id: str, *, lock: bool
) -> GroupRecord | None:
    query = statements.FIND_GROUP_LOCKED if lock else statements.FIND_GROUP
    row = (await connection.execute(query, {"group_id": group_id})).one_or_none()
    return None if row is None else _group_from_row(row)


async def save_group(connection: AsyncConnection, group: GroupRecord) -> None:
    await connection.execute(
        statements.SAVE_GROUP,
        {
            "key_group_id": group.group_id,
            "new_assignor": group.assignor,
            "new_group_epoch": group.group_epoch,
            "new_rebalance_requested": group.rebalance_requested,
            "new_rebalance_reason": group.rebalance_reason,
        },
    )


async def delete_expired_members(connection: AsyncConnection, group_id: str) -> list[str]:
    """Remove members whose session ran out; the group row must be locked by the caller."""
    result = await connection.execute(statements.DELETE_EXPIRED_MEMBERS, {"group_id": group_id})
    return sorted(row.member_id for row in result)


async def read_members(
    connection: AsyncConnection, group_id: str, *, live_only: bool = False
) -> list[MemberRecord]:
    query = statements.READ_LIVE_MEMBERS if live_only else statements.READ_MEMBERS
    result = await connection.execute(query, {"group_id": group_id})
    return [member_from_row(row) for row in result]


async def read_member(
    connection: AsyncConnection, group_id: str, member_id: str
) -> MemberRecord | None:
    result = await connection.execute(
        statements.READ_MEMBER, {"group_id": group_id, "member_id": member_id}
    )
    row = result.one_or_none()
    return None if row is None else member_from_row(row)


@dataclass(frozen=True)
class HeartbeatView:
    """What a heartbeat of an existing member needs, read in one statement under the group
    lock: the members that just expired (now deleted), the member itself if still live, and
    what the other live members hold on the partitions of its current target."""

    expired: list[str]
    member: MemberRecord | None
    held_by_others: tuple[Slice, ...]


async def reap_and_read_member(
    connection: AsyncConnection, group_id: str, member_id: str
) -> HeartbeatView:
    """Deletes the group's expired members and reads the rest in one round trip; the group
    row must be locked. The reads see the rows as before the delete, so they filter on
    ``expires_at`` themselves."""
    row = (
        await connection.execute(
            _REAP_AND_READ_MEMBER, {"group_id": group_id, "member_id": member_id}
        )
    ).one()
    expired, held, *member_columns = row
    member = None if member_columns[0] is None else member_from_row(member_columns)
    return HeartbeatView(sorted(expired), member, slices_from_wire(held))


def member_values(member: MemberRecord) -> dict[str, Any]:
    """The parameters of the statements that write a member (``coordinator.groups.statements``)."""
    return {
        "key_group_id": member.group_id,
        "key_member_id": member.member_id,
        "new_instance_id": member.instance_id,
        "new_client_id": member.client_id,
        "new_client_host": member.client_host,
        "new_member_epoch": member.member_epoch,
        "new_previous_member_epoch": member.previous_member_epoch,
        "new_subscribed_topics": list(member.subscribed_topics),
        "new_subscribed_topic_regex": member.subscribed_topic_regex,
        "new_assignor": member.assignor,
        "new_allow_individual_commit": member.allow_individual_commit,
        "new_session_timeout_ms": member.session_timeout_ms,
        "new_owned": slices_to_wire(member.owned),
        "new_assigned": slices_to_wire(member.assigned),
        "new_target": slices_to_wire(member.target),
        "new_standbys": slices_to_wire(member.standbys),
    }


async def insert_member(
    connection: AsyncConnection, member: MemberRecord, notice: Notice | None = None
) -> None:
    """Insert a joining member; ``notice``: a notice sent by the same statement."""
    if notice is None:
        await connection.execute(statements.INSERT_MEMBER, member_values(member))
    else:
        await connection.execute(
            statements.INSERT_MEMBER_ANNOUNCING, member_values(member) | notice.parameters()
        )


async def save_member(
    connection: AsyncConnection,
    member: MemberRecord,
    *,
    heartbeat: bool,
    notice: Notice | None = None,
) -> None:
    """Write a member back; ``heartbeat`` also renews its session (only its own request may).
    ``notice`` (a heartbeat's only): a notice sent by the same statement, which writes exactly
    one row, since members are only removed under their group's lock, which the caller holds."""
    if notice is not None:
        assert heartbeat, "only a heartbeat's own row carries its notice"
        await connection.execute(
            statements.SAVE_AND_RENEW_MEMBER_ANNOUNCING,
            member_values(member) | notice.parameters(),
        )
        return
    statement = statements.SAVE_AND_RENEW_MEMBER if heartbeat else statements.SAVE_MEMBER
    await connection.execute(statement, member_values(member))


async def save_targets(
    connection: AsyncConnection, group_id: str, targets: Mapping[str, tuple[Slice, ...]]
) -> None:
    """All new targets of a group in one statement, whatever the group's size."""
    if not targets:
        return
    ordered = sorted(targets.items())
    await connection.execute(
        _SAVE_TARGETS,
        {
            "group_id": group_id,
            "member_ids": [member_id for member_id, _ in ordered],
            "targets": [json.dumps(slices_to_wire(target)) for _, target in ordered],
        },
    )


@dataclass(frozen=True, slots=True)
class Notice:
    """A notice delivered to the channel's listeners when the transaction commits."""

    channel: str
    payload: str

    def parameters(self) -> dict[str, str]:
        return {"channel": self.channel, "notice": self.payload}


async def notify(connection: AsyncConnection, notice: Notice) -> None:
    await connection.execute(_NOTIFY, notice.parameters())


async def delete_member(connection: AsyncConnection, group_id: str, member_id: str) -> bool:
    result = await connection.execute(
        statements.DELETE_MEMBER, {"group_id": group_id, "member_id": member_id}
    )
    return result.one_or_none() is not None


@dataclass(frozen=True)
class Renewal:
    """A heartbeat that may only renew its member's session, as the stable path reads it.
    ``owned_json``: what it reports owning, as sent (None: absent); ``subscription``:
    (topics, regex) when it carries one; ``sent``: its value (None: absent) of each of
    ``SENT_FIELDS``."""

    group_id: str
    member_id: str
    member_epoch: int
    owned_json: str | None
    subscription: tuple[list[str], str | None] | None
    sent: Mapping[str, Any]


async def renew_stable_sessions(
    driver: asyncpg.Connection, renewals: Sequence[Renewal]
) -> list[StableHeartbeat | None]:
    """One statement for many common heartbeats: each renews its member's session when the
    member is live, at its epoch, owns exactly its assignment, which is its target, its group
    has no pending rebalance, and the request changes nothing. Answers in the order asked,
    None where any of that is false (or the member's row is locked by a change). Runs on the
    driver connection of a pooled connection in autocommit."""
    rows = await driver.fetch(
        _RENEW_STABLE_SESSIONS,
        [r.group_id for r in renewals],
        [r.member_id for r in renewals],
        [r.member_epoch for r in renewals],
        [r.owned_json for r in renewals],
        [r.subscription is not None for r in renewals],
        [None if r.subscription is None else json.dumps(r.subscription[0]) for r in renewals],
        [None if r.subscription is None else r.subscription[1] for r in renewals],
        *([r.sent[field.name] for r in renewals] for field in SENT_FIELDS),
    )
    renewed: list[StableHeartbeat | None] = [None] * len(renewals)
    for request, assigned, session_timeout_ms in rows:
        renewed[request - 1] = StableHeartbeat(assigned, session_timeout_ms)
    return renewed


async def live_subscriptions(connection: AsyncConnection) -> list[Subscription]:
    """Distinct subscriptions of live members, for the metadata refresh."""
    result = await connection.execute(
        select(Member.group_id, Member.subscribed_topics, Member.subscribed_topic_regex)
        .where(Member.expires_at > func.now())
        .distinct()
    )
    return [Subscription(row.group_id, list(row.subscribed_topics), row[2]) for row in result]


async def request_rebalances(
    connection: AsyncConnection, group_ids: Collection[str], reason: str
) -> None:
    if group_ids:
        await connection.execute(
            _REBALANCE_GROUPS, {"group_ids": sorted(group_ids), "reason": reason}
        )


async def rebalance_subscribers(
    connection: AsyncConnection, topics: Collection[str] | None, reason: str
) -> list[str]:
    """Flag every group with a live member subscribed to any of ``topics`` (None: every group
    with a live member); returns the groups flagged. Their next heartbeat recomputes targets."""
    subscribers = sorted(
        {
            s.group_id
            for s in await live_subscriptions(connection)
            if topics is None or s.covers(topics)
        }
    )
    await request_rebalances(connection, subscribers, reason)
    return subscribers


async def lock_groups_to_reap(connection: AsyncConnection, limit: int) -> list[str]:
    """Groups with expired members that no other transaction holds; they stay locked."""
    result = await connection.execute(_GROUPS_TO_REAP, {"limit": limit})
    return [row.group_id for row in result]


async def delete_expired_groups(
    connection: AsyncConnection, retention_minutes: int, limit: int
) -> tuple[int, list[str]]:
    """Delete up to ``limit`` groups idle for the retention, with their offsets; returns how
    many were candidates (fewer than ``limit``: no more now) and the ids deleted."""
    locked = await connection.execute(
        _LOCK_EXPIRED_GROUPS, {"minutes": retention_minutes, "limit": limit}
    )
    candidates = [row.group_id for row in locked]
    if not candidates:
        return 0, []
    deleted = await connection.execute(
        _DELETE_EXPIRED_GROUPS, {"minutes": retention_minutes, "group_ids": candidates}
    )
    return len(candidates), sorted(row.group_id for row in deleted)


async def existing_groups(connection: AsyncConnection, group_ids: Collection[str]) -> set[str]:
    result = await connection.execute(_EXISTING_GROUPS, {"group_ids": sorted(group_ids)})
    return {row.group_id for row in result}
