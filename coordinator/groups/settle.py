"""The group-level steps every writer of a group takes under the group's row lock: reap its
expired members, recompute targets with the group's assignor when something changed, and
store the group row last. The heartbeat, the admin operations and the reaper share them.

Targets are computed by the assignors in ``coordinator.core``; this module loads what they
need (members, partition counts, switches) and stores what they decide.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from client.protocol.keyspace import HASH_SPACE
from coordinator import metrics
from coordinator.core.assignment import (
    GroupAssignment,
    GroupSpec,
    MemberSpec,
    Slice,
    TopicSpec,
    member_loads,
    moved_hash_count,
    slices_from_wire,
    slices_to_wire,
)
from coordinator.core.assignors import get_assignor
from coordinator.db.switches import read_switches
from coordinator.errors import GroupIdNotFound
from coordinator.groups import metadata_repository, repository
from coordinator.groups.repository import GroupRow, MemberRow, WireSlices
from coordinator.settings import Settings

log = logging.getLogger(__name__)


def from_wire(slices: Iterable[Mapping[str, Any]]) -> tuple[Slice, ...]:
    return slices_from_wire(slices)


def canonical_wire(slices: Iterable[Slice]) -> WireSlices:
    """Normalized and sorted, so stored JSONB compares by plain equality."""
    return slices_to_wire(slices)


def group_assignor(members: Iterable[MemberRow], settings: Settings) -> str:
    """The most requested assignor (ties: by name), as KIP-848 picks a group's assignor."""
    votes = Counter(m.assignor or settings.default_assignor for m in members)
    if not votes:
        return settings.default_assignor
    return min(votes, key=lambda name: (-votes[name], name))


def resolved_topics(member: MemberRow, known_topics: Iterable[str]) -> list[str]:
    topics = set(member.subscribed_topics)
    if member.subscribed_topic_regex is not None:
        pattern = re.compile(member.subscribed_topic_regex)
        topics |= {t for t in known_topics if pattern.fullmatch(t)}
    return sorted(topics)


async def _recompute_targets(
    connection: AsyncConnection,
    group: GroupRow,
    members: Mapping[str, MemberRow],
    settings: Settings,
    reason: str,
    *,
    unsaved: str | None = None,
) -> GroupRow:
    """Run the group's assignor and store every member's new target. ``unsaved`` names a
    member whose row the caller writes itself (a join not inserted yet)."""
    assignor_name = group_assignor(members.values(), settings)
    if any(m.subscribed_topic_regex for m in members.values()):
        counts = await metadata_repository.read_partition_counts(connection, None)
    else:
        counts = await metadata_repository.read_partition_counts(
            connection, {t for m in members.values() for t in m.subscribed_topics}
        )
    subscriptions = {mid: resolved_topics(m, counts) for mid, m in members.items()}
    subscribed = {t for topics in subscriptions.values() for t in topics if t in counts}
    range_fetch = await metadata_repository.read_range_fetch(connection, subscribed)
    switches = await read_switches(connection, settings)
    old_targets = {mid: from_wire(m.target) for mid, m in members.items()}
    spec = GroupSpec.of(
        (
            MemberSpec(
                member_id=mid,
                subscribed_topics=frozenset(t for t in subscriptions[mid] if t in counts),
                allow_individual_commit=m.allow_individual_commit,
                # Stickiness keeps the previous target: what members report lags behind it.
                owned=old_targets[mid],
                member_epoch=m.member_epoch,
                instance_id=m.instance_id,
            )
            for mid, m in members.items()
        ),
        (
            TopicSpec(
                name=t,
                partition_count=counts[t],
                accept_range_fetch=range_fetch.get(t, switches.default_accept_range_fetch),
            )
            for t in sorted(subscribed)
        ),
        accept_individual_commit=switches.accept_individual_commit,
    )
    assignment = get_assignor(assignor_name).assign(spec)
    _record_rebalance(group.group_id, reason, old_targets, assignment)
    changed: dict[str, WireSlices] = {}
    for mid, member in members.items():
        wire = canonical_wire(assignment.get(mid, ()))
        if wire != member.target:
            member.target = wire
            if mid != unsaved:
                changed[mid] = wire
    await repository.save_targets(connection, group.group_id, changed)
    log.info(
        "target assignment computed",
        extra={
            "group_id": group.group_id,
            "reason": reason,
            "assignor": assignor_name,
            "members": len(members),
            "changed_targets": len(changed),
        },
    )
    return GroupRow(
        group_id=group.group_id,
        assignor=assignor_name,
        group_epoch=group.group_epoch + 1,
        rebalance_requested=False,
        rebalance_reason=None,
    )


def _record_rebalance(
    group_id: str, reason: str, before: GroupAssignment, after: GroupAssignment
) -> None:
    metrics.REBALANCES.labels(reason=reason).inc()
    metrics.HASH_SPACE_MOVED.observe(moved_hash_count(before, after) / HASH_SPACE)
    loads = list(member_loads(after).values())
    metrics.MEMBER_LOAD.labels(group_id, "max").set(max(loads, default=0.0))
    metrics.MEMBER_LOAD.labels(group_id, "min").set(min(loads, default=0.0))


async def settle_group(
    connection: AsyncConnection,
    group: GroupRow,
    members: Mapping[str, MemberRow],
    settings: Settings,
    reasons: list[str],
    *,
    unsaved: str | None = None,
) -> GroupRow:
    """Recompute targets when membership, subscriptions or topics changed. The new group row
    is the caller's to store, as its transaction's last write (see ``save_group``)."""
    if group.rebalance_requested:
        reasons.append(group.rebalance_reason or "rebalance requested")
    if reasons:
        group = await _recompute_targets(
            connection, group, members, settings, reasons[0], unsaved=unsaved
        )
    return group


async def save_group(connection: AsyncConnection, before: GroupRow, after: GroupRow) -> None:
    """Written last: a new version of a group row makes commits of that group (which insert
    the row if missing) wait for this transaction, so it must not wait for anything after
    it, such as member rows those commits hold."""
    if after != before:
        await repository.save_group(connection, after)


async def read_members(connection: AsyncConnection, group_id: str) -> dict[str, MemberRow]:
    return {m.member_id: m for m in await repository.read_members(connection, group_id)}


async def reap_locked(connection: AsyncConnection, group_id: str) -> list[str]:
    """Remove the group's expired members (its row is locked); returns their ids."""
    expired = await repository.delete_expired_members(connection, group_id)
    log_expired(group_id, expired)
    return expired


def log_expired(group_id: str, expired: list[str]) -> None:
    for member_id in expired:
        log.info("member session expired", extra={"group_id": group_id, "member_id": member_id})


def expiry_reasons(expired: list[str]) -> list[str]:
    return ["member session expired"] if expired else []


async def lock_existing_group(
    connection: AsyncConnection, group_id: str
) -> tuple[GroupRow, dict[str, MemberRow], list[str]]:
    group = await repository.find_group(connection, group_id, lock=True)
    if group is None:
        raise GroupIdNotFound(f"group '{group_id}' does not exist")
    expired = await reap_locked(connection, group_id)
    return group, await read_members(connection, group_id), expired
