"""Membership checks the offset store needs (DESIGN §3.7): who may commit, and whether a
group has live members. Kept apart from the heartbeat service so the commit path loads
only what it uses.

Locks: a member's commit holds its member row FOR SHARE and a standalone commit holds the
group row FOR SHARE, while joins, leaves, epoch bumps and reaping take those rows FOR
UPDATE, so a commit is checked against membership that cannot change until it commits.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.errors import FencedMemberEpoch, UnknownMemberId

_MEMBER = text(
    """
    SELECT member_epoch, previous_member_epoch, expires_at > now() AS alive
    FROM members WHERE group_id = :group_id AND member_id = :member_id
    FOR SHARE
    """
)

_LIVE_MEMBERS_LOCKING_GROUP = text(
    """
    SELECT (SELECT count(*) FROM members m
            WHERE m.group_id = g.group_id AND m.expires_at > now())
    FROM groups g WHERE g.group_id = :group_id
    FOR SHARE OF g
    """
)

_LIVE_MEMBERS = text(
    "SELECT count(*) FROM members WHERE group_id = :group_id AND expires_at > now()"
)


async def check_commit_fencing(
    connection: AsyncConnection, group_id: str, member_id: str | None, member_epoch: int | None
) -> None:
    if member_id is None:
        result = await connection.execute(_LIVE_MEMBERS_LOCKING_GROUP, {"group_id": group_id})
        live = result.scalar_one_or_none() or 0
        if live:
            raise UnknownMemberId(
                f"group '{group_id}' has {live} live member(s); a commit without member id is "
                "only accepted while the group has none"
            )
        return
    row = (
        await connection.execute(_MEMBER, {"group_id": group_id, "member_id": member_id})
    ).one_or_none()
    if row is None or not row.alive:
        raise UnknownMemberId(f"member '{member_id}' is not a live member of '{group_id}'")
    # The previous epoch is accepted too: a member commits what it processed while its
    # revocation (which bumped the epoch) is in flight.
    if member_epoch not in (row.member_epoch, row.previous_member_epoch):
        raise FencedMemberEpoch(
            f"member epoch {member_epoch} is stale; the member's epoch is {row.member_epoch}",
            member_epoch=row.member_epoch,
        )


async def count_live_members(connection: AsyncConnection, group_id: str) -> int:
    result = await connection.execute(_LIVE_MEMBERS, {"group_id": group_id})
    return int(result.scalar_one())


async def request_rebalance(connection: AsyncConnection, group_id: str, reason: str) -> None:
    await connection.execute(
        text(
            "UPDATE groups SET rebalance_requested = true, rebalance_reason = :reason "
            "WHERE group_id = :group_id"
        ),
        {"group_id": group_id, "reason": reason},
    )
