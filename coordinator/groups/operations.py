"""Membership operations an operator asks for (docs/api.md): describe a group, force a
rebalance, remove a member. Each takes the group's row lock like a heartbeat does."""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.core.assignment import Slice, slices_to_wire
from coordinator.core.membership import GroupRecord, MemberRecord, expiry_reasons, group_state
from coordinator.errors import GroupIdNotFound, UnknownMemberId
from coordinator.groups import endpoint_repository, repository, stuck_repository
from coordinator.groups.schemas import (
    GroupDescription,
    GroupOwnersReply,
    MemberDescription,
    OwnedRanges,
    RebalanceReply,
    RemovedMemberReply,
    SliceJson,
    StuckCallDescription,
)
from coordinator.groups.settle import (
    lock_existing_group,
    save_group,
    settle_group,
)
from coordinator.settings import Settings

log = logging.getLogger(__name__)


def _slices_json(slices: tuple[Slice, ...]) -> list[SliceJson]:
    return [SliceJson.model_validate(s) for s in slices_to_wire(slices)]


def _stuck_calls(report: stuck_repository.StuckReport | None) -> list[StuckCallDescription]:
    """A member's report, aged to now and in key order, each call also said in one line."""
    if report is None:
        return []
    described = []
    for call in sorted(
        report.calls, key=lambda c: (c["topic"], c["partition"], c["key_hash"], c["offset"])
    ):
        running_for_s = call["running_s"] + report.age_s
        described.append(
            StuckCallDescription(
                **call,
                reported_at=report.reported_at,
                report_age_s=round(report.age_s, 3),
                running_for_s=round(running_for_s, 3),
                summary=(
                    f"slice {call['topic']}[{call['partition']}] key hash {call['key_hash']} "
                    f"held by a stuck call at offset {call['offset']} for {running_for_s:.1f} s"
                ),
            )
        )
    return described


async def _live_members(
    connection: AsyncConnection, group_id: str
) -> tuple[GroupRecord, list[MemberRecord], dict[str, str]]:
    """The group, its live members and the addresses they serve queries on, as both the
    admin description and the owners route read them."""
    group = await repository.find_group(connection, group_id, lock=False)
    if group is None:
        raise GroupIdNotFound(f"group '{group_id}' does not exist")
    members = await repository.read_members(connection, group_id, live_only=True)
    endpoints = await endpoint_repository.read_endpoints(connection, group_id)
    return group, members, endpoints


async def describe(connection: AsyncConnection, group_id: str) -> GroupDescription:
    group, members, endpoints = await _live_members(connection, group_id)
    stuck = await stuck_repository.read_stuck(connection, group_id)
    return GroupDescription(
        group_id=group_id,
        state=group_state(group, members),
        assignor=group.assignor,
        group_epoch=group.group_epoch,
        rebalance_requested=group.rebalance_requested,
        rebalance_reason=group.rebalance_reason,
        members=[
            MemberDescription(
                member_id=m.member_id,
                instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                joined_at=m.joined_at,
                last_heartbeat=m.last_heartbeat,
                expires_at=m.expires_at,
                member_epoch=m.member_epoch,
                subscribed_topics=list(m.subscribed_topics),
                subscribed_topic_regex=m.subscribed_topic_regex,
                assignor=m.assignor,
                allow_individual_commit=m.allow_individual_commit,
                session_timeout_ms=m.session_timeout_ms,
                owned=_slices_json(m.owned),
                assigned=_slices_json(m.assigned),
                target=_slices_json(m.target),
                stuck=_stuck_calls(stuck.get(m.member_id)),
                endpoint=endpoints.get(m.member_id),
                standbys=_slices_json(m.standbys),
            )
            for m in members
        ],
    )


async def owners(connection: AsyncConnection, group_id: str) -> GroupOwnersReply:
    """The owned slices of the group's live members, read as ``describe`` reads them."""
    group, members, endpoints = await _live_members(connection, group_id)
    return GroupOwnersReply(
        group_id=group_id,
        group_epoch=group.group_epoch,
        owners=[
            OwnedRanges(
                topic=owned.topic,
                partition=owned.partition,
                ranges=owned.ranges,
                member_id=m.member_id,
                instance_id=m.instance_id,
                endpoint=endpoints.get(m.member_id),
            )
            for m in members
            for owned in _slices_json(m.owned)
        ],
    )


async def force_rebalance(
    connection: AsyncConnection, group_id: str, settings: Settings
) -> RebalanceReply:
    group, members, expired = await lock_existing_group(connection, group_id)
    reasons = ["admin request", *expiry_reasons(expired)]
    settled = await settle_group(
        connection, group, members, settings, reasons, removed=bool(expired)
    )
    await save_group(connection, group, settled)
    log.info("rebalance forced", extra={"group_id": group_id, "group_epoch": settled.group_epoch})
    return RebalanceReply(group_id=group_id, group_epoch=settled.group_epoch)


async def remove_member(
    connection: AsyncConnection, group_id: str, member_id: str, settings: Settings
) -> RemovedMemberReply:
    group, members, expired = await lock_existing_group(connection, group_id)
    if members.pop(member_id, None) is None:
        raise UnknownMemberId(f"member '{member_id}' is not a live member of '{group_id}'")
    await repository.delete_member(connection, group_id, member_id)
    reasons = ["member removed by admin", *expiry_reasons(expired)]
    settled = await settle_group(connection, group, members, settings, reasons, removed=True)
    await save_group(connection, group, settled)
    log.info("member removed by admin", extra={"group_id": group_id, "member_id": member_id})
    return RemovedMemberReply(
        group_id=group_id, member_id=member_id, group_epoch=settled.group_epoch
    )
