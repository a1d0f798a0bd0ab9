"""Membership checks the offset store needs (DESIGN §3.7): who may commit, and whether a
group has live members. Kept apart from the heartbeat service so the commit path loads
only what it uses.

Locks: a member's commit holds its member row FOR SHARE and a standalone commit holds the
group row FOR SHARE, while joins, leaves, epoch bumps and reaping take those rows FOR
UPDATE, so a commit is checked against membership that cannot change until it commits.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.errors import FencedMemberEpoch, UnknownMemberId

# The checks as CTEs named ``fence`` (parameters :group_id, :member_id, :member_epoch), so the
# offset store can fold them into the one statement that also locks a commit's partitions;
# ``check_commit_fencing`` runs the same text on its own. A row means the subject (the group
# row, or the member row) was found and is now locked; no row means it was not found.
STANDALONE_FENCE = """
    fence AS (
        SELECT live.members = 0 AS passed, live.members AS live_members,
               NULL::integer AS member_epoch, NULL::boolean AS alive
        FROM groups g,
             LATERAL (SELECT count(*) AS members FROM members m
                      WHERE m.group_id = g.group_id AND m.expires_at > now()) AS live
        WHERE g.group_id = :group_id
        FOR SHARE OF g
    )
"""

# The previous epoch is accepted too: a member commits what it processed while its
# revocation (which bumped the epoch) is in flight.
MEMBER_FENCE = """
    fence AS (
        SELECT expires_at > now() AND CAST(:member_epoch AS integer)
                   IN (member_epoch, previous_member_epoch) AS passed,
               NULL::bigint AS live_members, member_epoch, expires_at > now() AS alive
        FROM members WHERE group_id = :group_id AND member_id = :member_id
        FOR SHARE
    )
"""

_CHECK = {
    standalone: text(f"WITH {cte} SELECT passed, live_members, member_epoch, alive FROM fence")
    for standalone, cte in ((True, STANDALONE_FENCE), (False, MEMBER_FENCE))
}

_LIVE_MEMBERS = text(
    "SELECT count(*) FROM members WHERE group_id = :group_id AND expires_at > now()"
)


@dataclass(frozen=True)
class CommitFence:
    """The membership facts a commit is judged on, read under the lock that keeps them true."""

    passed: bool
    live_members: int | None
    member_epoch: int | None
    alive: bool | None


def commit_refusal(
    group_id: str, member_id: str | None, member_epoch: int | None, fence: CommitFence | None
) -> UnknownMemberId | FencedMemberEpoch:
    """The error refusing a commit whose fence did not pass (``fence`` None: nothing found)."""
    if member_id is None:
        live = fence.live_members if fence is not None else 0
        return UnknownMemberId(
            f"group '{group_id}' has {live} live member(s); a commit without member id is "
            "only accepted while the group has none"
        )
    if fence is None or not fence.alive:
        return UnknownMemberId(f"member '{member_id}' is not a live member of '{group_id}'")
    return FencedMemberEpoch(
        f"member epoch {member_epoch} is stale; the member's epoch is {fence.member_epoch}",
        member_epoch=fence.member_epoch,
    )


async def check_commit_fencing(
    connection: AsyncConnection, group_id: str, member_id: str | None, member_epoch: int | None
) -> None:
    standalone = member_id is None
    parameters = (
        {"group_id": group_id}
        if standalone
        else {"group_id": group_id, "member_id": member_id, "member_epoch": member_epoch}
    )
    result = await connection.execute(_CHECK[standalone], parameters)
    row = result.one_or_none()
    fence = None if row is None else CommitFence(*row)
    # A standalone commit to a group not stored yet has no members to be fenced by.
    if (fence is None and standalone) or (fence is not None and fence.passed):
        return
    raise commit_refusal(group_id, member_id, member_epoch, fence)


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
