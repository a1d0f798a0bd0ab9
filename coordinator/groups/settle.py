"""The group-level steps every writer of a group takes under the group's row lock: reap its
expired members, load what a recomputation of targets needs, store what
``coordinator.core.membership`` decided, and store the group row last. The heartbeat, the
admin operations and the reaper share them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from sqlalchemy.ext.asyncio import AsyncConnection

from client.protocol.keyspace import HASH_SPACE
from coordinator import metrics
from coordinator.core.assignment import member_loads, moved_hash_count
from coordinator.core.handoff import GroupChange, settle_change
from coordinator.core.membership import (
    GroupRecord,
    MemberRecord,
    Rebalance,
    SessionLimits,
    TopicFacts,
    TopicsNeeded,
    settle,
)
from coordinator.db.switches import accept_individual_commit
from coordinator.errors import GroupIdNotFound
from coordinator.groups import metadata_repository, repository
from coordinator.groups.watch import CHANNEL, encode_change
from coordinator.settings import Settings

log = logging.getLogger(__name__)


def session_limits(settings: Settings) -> SessionLimits:
    return SessionLimits(
        default_ms=settings.session_timeout_default_ms,
        min_ms=settings.session_timeout_min_ms,
        max_ms=settings.session_timeout_max_ms,
    )


async def read_topic_facts(
    connection: AsyncConnection, wanted: TopicsNeeded, settings: Settings
) -> TopicFacts:
    stored = await metadata_repository.read_topic_facts(connection, wanted.topics)
    return TopicFacts(
        partition_counts=stored.partition_counts,
        accept_range_fetch=stored.accept_range_fetch,
        default_accept_range_fetch=(
            settings.default_accept_range_fetch
            if stored.default_accept_range_fetch is None
            else stored.default_accept_range_fetch
        ),
        accept_individual_commit=accept_individual_commit(
            stored.accept_individual_commit, settings
        ),
    )


def record_rebalance(group_id: str, rebalance: Rebalance | None) -> None:
    if rebalance is None:
        return
    metrics.REBALANCES.labels(reason=rebalance.reason).inc()
    metrics.HASH_SPACE_MOVED.observe(
        moved_hash_count(rebalance.before, rebalance.after) / HASH_SPACE
    )
    loads = list(member_loads(rebalance.after).values())
    metrics.MEMBER_LOAD.labels(group_id, "max").set(max(loads, default=0.0))
    metrics.MEMBER_LOAD.labels(group_id, "min").set(min(loads, default=0.0))
    log.info(
        "target assignment computed",
        extra={
            "group_id": group_id,
            "reason": rebalance.reason,
            "assignor": rebalance.assignor,
            "members": rebalance.members,
            "changed_targets": rebalance.changed_targets,
        },
    )


async def settle_group(
    connection: AsyncConnection,
    group: GroupRecord,
    members: Mapping[str, MemberRecord],
    settings: Settings,
    reasons: list[str],
    *,
    removed: bool,
) -> GroupRecord:
    """Recompute and store targets when membership, subscriptions or topics changed
    (``removed``: the caller removed members, whose holdings are free now). The new group row
    is the caller's to store, as its transaction's last write (see ``save_group``)."""
    topics: TopicFacts | None = None
    while True:
        settled = settle(group, members, reasons, topics, settings.default_assignor)
        if not isinstance(settled, TopicsNeeded):
            break
        topics = await read_topic_facts(connection, settled, settings)
    targets = settled.changed_targets(members)
    await repository.save_targets(connection, group.group_id, targets)
    await announce(connection, settle_change(group.group_id, targets, removed))
    record_rebalance(group.group_id, settled.rebalance)
    return settled.group


def notice_of(change: GroupChange | None) -> repository.Notice | None:
    """The notice that tells every replica's held heartbeats of ``change`` once the
    transaction commits (``groups.watch``); None when nothing changed."""
    return None if change is None else repository.Notice(CHANNEL, encode_change(change))


async def announce(connection: AsyncConnection, change: GroupChange | None) -> None:
    """Send :func:`notice_of` ``change`` in a statement of its own."""
    notice = notice_of(change)
    if notice is not None:
        await repository.notify(connection, notice)


async def save_group(connection: AsyncConnection, before: GroupRecord, after: GroupRecord) -> None:
    """Written last: a new version of a group row makes commits of that group (which insert
    the row if missing) wait for this transaction, so it must not wait for anything after
    it, such as member rows those commits hold."""
    if after != before:
        await repository.save_group(connection, after)


async def read_members(connection: AsyncConnection, group_id: str) -> dict[str, MemberRecord]:
    return {m.member_id: m for m in await repository.read_members(connection, group_id)}


async def reap_locked(connection: AsyncConnection, group_id: str) -> list[str]:
    """Remove the group's expired members (its row is locked); returns their ids."""
    expired = await repository.delete_expired_members(connection, group_id)
    log_expired(group_id, expired)
    return expired


def log_expired(group_id: str, expired: Collection[str]) -> None:
    for member_id in expired:
        log.info("member session expired", extra={"group_id": group_id, "member_id": member_id})


async def lock_existing_group(
    connection: AsyncConnection, group_id: str
) -> tuple[GroupRecord, dict[str, MemberRecord], list[str]]:
    group = await repository.find_group(connection, group_id, lock=True)
    if group is None:
        raise GroupIdNotFound(f"group '{group_id}' does not exist")
    expired = await reap_locked(connection, group_id)
    return group, await read_members(connection, group_id), expired
