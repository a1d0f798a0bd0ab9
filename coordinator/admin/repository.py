"""SQL of the admin routes that the offset and group repositories don't already have."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.db.models import (
    CoordinatorConfig,
    Group,
    Member,
    PartitionOffsets,
    TopicConfig,
)


async def list_groups(
    connection: AsyncConnection,
) -> list[tuple[str, datetime, int, int, str | None]]:
    """Each group with its committed partition count and live member count."""
    partitions = (
        select(PartitionOffsets.group_id, func.count().label("partitions"))
        .group_by(PartitionOffsets.group_id)
        .subquery()
    )
    members = (
        select(Member.group_id, func.count().label("members"))
        .where(Member.expires_at > func.now())
        .group_by(Member.group_id)
        .subquery()
    )
    result = await connection.execute(
        select(
            Group.group_id,
            Group.created_at,
            func.coalesce(partitions.c.partitions, 0),
            func.coalesce(members.c.members, 0),
            Group.assignor,
        )
        .outerjoin(partitions, partitions.c.group_id == Group.group_id)
        .outerjoin(members, members.c.group_id == Group.group_id)
        .order_by(Group.group_id)
    )
    return [(row[0], row[1], int(row[2]), int(row[3]), row[4]) for row in result]


async def group_exists(connection: AsyncConnection, group_id: str, *, lock: bool) -> bool:
    query = select(Group.group_id).where(Group.group_id == group_id)
    if lock:
        # Not FOR UPDATE: that would block the KEY SHARE lock concurrent commits take on the
        # group when they write offset rows, while this waits on those rows (a deadlock).
        query = query.with_for_update(key_share=True)
    return (await connection.execute(query)).scalar_one_or_none() is not None


async def delete_group(connection: AsyncConnection, group_id: str) -> int:
    result = await connection.execute(
        text("DELETE FROM groups WHERE group_id = :group_id"), {"group_id": group_id}
    )
    return int(result.rowcount or 0)


async def get_topic_config(connection: AsyncConnection, topic: str) -> bool | None:
    result = await connection.execute(
        select(TopicConfig.accept_range_fetch).where(TopicConfig.topic == topic)
    )
    value = result.scalar_one_or_none()
    return None if value is None else bool(value)


async def set_topic_config(connection: AsyncConnection, topic: str, accept: bool) -> None:
    statement = insert(TopicConfig).values(topic=topic, accept_range_fetch=accept)
    await connection.execute(
        statement.on_conflict_do_update(
            index_elements=[TopicConfig.topic],
            set_={"accept_range_fetch": accept, "updated_at": func.now()},
        )
    )


async def set_switches(
    connection: AsyncConnection, accept: bool, default_range_fetch: bool
) -> None:
    statement = insert(CoordinatorConfig).values(
        id=1, accept_individual_commit=accept, default_accept_range_fetch=default_range_fetch
    )
    await connection.execute(
        statement.on_conflict_do_update(
            index_elements=[CoordinatorConfig.id],
            set_={
                "accept_individual_commit": accept,
                "default_accept_range_fetch": default_range_fetch,
                "updated_at": func.now(),
            },
        )
    )


async def count_live_members(connection: AsyncConnection, group_id: str) -> int:
    result = await connection.execute(
        select(func.count())
        .select_from(Member)
        .where(Member.group_id == group_id, Member.expires_at > func.now())
    )
    return int(result.scalar_one())
