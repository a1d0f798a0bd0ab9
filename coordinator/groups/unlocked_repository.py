"""The two statements of a heartbeat served without its group's turn
(``coordinator.groups.heartbeat.unlocked_heartbeat``): a read of what the step needs, and a
write of the member's row that happens only if neither its row nor its group's changed since.

Each row's ``xmin`` is the transaction that wrote its current version, so an equal ``xmin``
means an unchanged row. The write takes the group's row ``FOR SHARE``, which waits for a locked
path's transaction holding the group (``FOR NO KEY UPDATE``) to end; when it does, Postgres
checks the conditions again on the rows as that transaction left them (READ COMMITTED's
recheck of updated rows). So the write lands between two locked transactions of the group,
never inside one, and only on the rows the step decided from.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Text

from coordinator.core.assignment import Slice, slices_from_wire
from coordinator.core.membership import GroupRecord, MemberRecord
from coordinator.db.models import Member
from coordinator.groups import statements
from coordinator.groups.repository import (
    HELD_BY_OTHERS_OF_ME,
    MY_COLUMNS,
    Notice,
    member_from_row,
    member_values,
)

_READ = text(
    f"""
    SELECT
        g.xmin::text AS group_version,
        g.group_id, g.assignor, g.group_epoch, g.rebalance_requested, g.rebalance_reason,
        me.xmin::text AS member_version,
        EXISTS (
            SELECT FROM members x WHERE x.group_id = :group_id AND x.expires_at <= now()
        ) AS any_expired,
        {HELD_BY_OTHERS_OF_ME} AS held,
        {MY_COLUMNS}
    FROM groups g JOIN members me ON me.group_id = g.group_id
    WHERE g.group_id = :group_id AND me.member_id = :member_id AND me.expires_at > now()
    """
)

# The member's session still running, and its row and its group's as the snapshot read them.
_UNCHANGED = (
    text("members.expires_at > now()"),
    text("members.xmin::text = :member_version").bindparams(
        bindparam("member_version", type_=Text)
    ),
    text(
        "EXISTS (SELECT FROM groups g WHERE g.group_id = members.group_id"
        " AND g.xmin::text = :group_version FOR SHARE)"
    ).bindparams(bindparam("group_version", type_=Text)),
)
_SAVE_IF_UNCHANGED = statements.SAVE_AND_RENEW_MEMBER.where(*_UNCHANGED).returning(Member.member_id)
_SAVE_AND_ANNOUNCE_IF_UNCHANGED = statements.SAVE_AND_RENEW_MEMBER_ANNOUNCING.where(*_UNCHANGED)


@dataclass(frozen=True, slots=True)
class UnlockedView:
    """A live member and its group as one snapshot saw them, with each row's version, and
    what the other live members hold on the partitions of the member's target.
    ``any_expired``: some member of the group has outlived its session, which only the
    locked path may reap."""

    group: GroupRecord
    group_version: str
    member: MemberRecord
    member_version: str
    held_by_others: tuple[Slice, ...]
    any_expired: bool


async def read_view(
    connection: AsyncConnection, group_id: str, member_id: str
) -> UnlockedView | None:
    """None when the group or the live member is not there."""
    row = (
        await connection.execute(_READ, {"group_id": group_id, "member_id": member_id})
    ).one_or_none()
    if row is None:
        return None
    group_version, group_id, assignor, group_epoch, rebalance_requested, reason, *rest = row
    member_version, any_expired, held, *member_columns = rest
    return UnlockedView(
        group=GroupRecord(group_id, assignor, int(group_epoch), bool(rebalance_requested), reason),
        group_version=group_version,
        member=member_from_row(member_columns),
        member_version=member_version,
        held_by_others=slices_from_wire(held),
        any_expired=bool(any_expired),
    )


async def save_if_unchanged(
    connection: AsyncConnection,
    view: UnlockedView,
    member: MemberRecord,
    notice: Notice | None,
) -> bool:
    """Write ``member``, renew its session and send ``notice`` (delivered when the statement
    commits), unless its session ran out or its row or its group's changed since ``view``
    was read; whether it was written."""
    parameters = member_values(member) | {
        "member_version": view.member_version,
        "group_version": view.group_version,
    }
    if notice is None:
        statement = _SAVE_IF_UNCHANGED
    else:
        statement, parameters = _SAVE_AND_ANNOUNCE_IF_UNCHANGED, parameters | notice.parameters()
    return (await connection.execute(statement, parameters)).one_or_none() is not None
