"""Statements of group membership that run on every locked heartbeat, built once.

Building a statement per call cost more Python than running it, and SQLAlchemy's expression
objects form reference cycles that only the collector frees: at 10,000 waiting members the
statements a join's hand-off ran fed collector pauses of hundreds of milliseconds, which held
every group's replies (bench/history/2026-11-26-issue-29-part-3-round-4.md).
``tests/groups/test_heartbeat_garbage.py`` keeps it so.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, delete, func, literal_column, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import Text

from coordinator.db.models import Group, Member

ONE_MILLISECOND: ColumnElement[Any] = literal_column("interval '1 millisecond'")

MEMBER_COLUMNS = (
    Member.group_id,
    Member.member_id,
    Member.instance_id,
    Member.client_id,
    Member.client_host,
    Member.member_epoch,
    Member.previous_member_epoch,
    Member.subscribed_topics,
    Member.subscribed_topic_regex,
    Member.assignor,
    Member.allow_individual_commit,
    Member.session_timeout_ms,
    Member.owned,
    Member.assigned,
    Member.target,
    Member.joined_at,
    Member.last_heartbeat,
    Member.expires_at,
    Member.standbys,
)


GROUP_ID_PARAM = bindparam("group_id", type_=Text)
MEMBER_ID_PARAM = bindparam("member_id", type_=Text)

FIND_GROUP = select(
    Group.group_id,
    Group.assignor,
    Group.group_epoch,
    Group.rebalance_requested,
    Group.rebalance_reason,
).where(Group.group_id == GROUP_ID_PARAM)
# NO KEY UPDATE serialises membership changes of the group without blocking the KEY SHARE
# lock that writing its offset rows takes (their foreign key): a commit holding a member row
# FOR SHARE must not wait on a heartbeat that waits on it.
FIND_GROUP_LOCKED = FIND_GROUP.with_for_update(key_share=True)

SAVE_GROUP = (
    update(Group)
    .where(Group.group_id == bindparam("key_group_id", type_=Text))
    .values(
        {
            name: bindparam(f"new_{name}", type_=Group.__table__.c[name].type)
            for name in ("assignor", "group_epoch", "rebalance_requested", "rebalance_reason")
        }
    )
)

READ_MEMBERS = (
    select(*MEMBER_COLUMNS).where(Member.group_id == GROUP_ID_PARAM).order_by(Member.member_id)
)
READ_LIVE_MEMBERS = READ_MEMBERS.where(Member.expires_at > func.now())
READ_MEMBER = select(*MEMBER_COLUMNS).where(
    Member.group_id == GROUP_ID_PARAM, Member.member_id == MEMBER_ID_PARAM
)

DELETE_EXPIRED_MEMBERS = (
    delete(Member)
    .where(Member.group_id == GROUP_ID_PARAM, Member.expires_at <= func.now())
    .returning(Member.member_id)
)
DELETE_MEMBER = (
    delete(Member)
    .where(Member.group_id == GROUP_ID_PARAM, Member.member_id == MEMBER_ID_PARAM)
    .returning(Member.member_id)
)

# What ``repository.member_values`` fills in: every column of a member a heartbeat step may change.
MEMBER_VALUES = {
    name: bindparam(f"new_{name}", type_=Member.__table__.c[name].type)
    for name in (
        "instance_id",
        "client_id",
        "client_host",
        "member_epoch",
        "previous_member_epoch",
        "subscribed_topics",
        "subscribed_topic_regex",
        "assignor",
        "allow_individual_commit",
        "session_timeout_ms",
        "owned",
        "assigned",
        "target",
        "standbys",
    )
}
# The session as the request renews it: from now, for the session timeout being written.
RENEWED_SESSION = {
    "last_heartbeat": func.now(),
    "expires_at": func.now() + MEMBER_VALUES["session_timeout_ms"] * ONE_MILLISECOND,
}
SAVE_MEMBER = (
    update(Member)
    .where(
        Member.group_id == bindparam("key_group_id", type_=Text),
        Member.member_id == bindparam("key_member_id", type_=Text),
    )
    .values(MEMBER_VALUES)
)
SAVE_AND_RENEW_MEMBER = SAVE_MEMBER.values(RENEWED_SESSION)
INSERT_MEMBER = insert(Member).values(
    {
        "group_id": bindparam("key_group_id", type_=Text),
        "member_id": bindparam("key_member_id", type_=Text),
        **MEMBER_VALUES,
        **RENEWED_SESSION,
    }
)
# The heartbeat's own row, written with the notice of the change it made: evaluated once, for
# the one row written, and delivered at commit like a notice of its own statement. A round
# trip fewer for each heartbeat of a hand-off's chain, which the group's turn serialises.
ANNOUNCING = func.pg_notify(bindparam("channel", type_=Text), bindparam("notice", type_=Text))
SAVE_AND_RENEW_MEMBER_ANNOUNCING = SAVE_AND_RENEW_MEMBER.returning(ANNOUNCING)
INSERT_MEMBER_ANNOUNCING = INSERT_MEMBER.returning(ANNOUNCING)
