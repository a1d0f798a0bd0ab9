"""The heartbeat: join, heartbeat and leave (DESIGN §5, in the manner of KIP-848). Protocol
decisions are recorded in docs/membership.md.

The pure parts live in ``coordinator.core``: assignors compute each member's *target*,
``reconcile`` decides what a member may own *now*, and ``fence`` whether its epoch counts.
This module is the shell around them: it runs every change under the group's row lock inside
the caller's transaction (never committing), so several coordinator replicas can share one
database.

Safety rests on one rule: a member's ``assigned`` changes only on that member's own
heartbeat, when its request epoch proves it saw the previous assignment. Everything the
member might still hold — what it reports owning, plus what it was told it may own and has not
acknowledged losing — stays in its stored ``owned | assigned`` ("held"), and nobody is
assigned a hash that another live member holds.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterable
from functools import lru_cache

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from client.protocol.epochs import FIRST_MEMBER_EPOCH, JOIN_EPOCH, LEAVE_EPOCH
from coordinator.core.assignment import (
    Slice,
    normalize_slices,
    slices_from_wire,
    subtract_slices,
    union_slices,
)
from coordinator.core.assignors import ASSIGNORS, UnknownAssignorError
from coordinator.core.fence import MemberStanding, member_refusal
from coordinator.core.reconcile import MemberHolding, accept_reported_owned, reconcile_member
from coordinator.errors import InvalidRequest, ServiceUnavailable
from coordinator.groups import metadata_repository, repository
from coordinator.groups.repository import GroupRow, MemberRow, WireSlices
from coordinator.groups.schemas import (
    HeartbeatReply,
    HeartbeatRequest,
    SliceJson,
)
from coordinator.groups.settle import (
    canonical_wire,
    expiry_reasons,
    from_wire,
    log_expired,
    read_members,
    reap_locked,
    save_group,
    settle_group,
)
from coordinator.kafka import ClusterMetadata, KafkaClusterError
from coordinator.settings import Settings

log = logging.getLogger(__name__)


def _request_slices(slices: Iterable[SliceJson]) -> tuple[Slice, ...]:
    return slices_from_wire(s.model_dump() for s in slices)


def clamp_session_timeout(requested: int | None, settings: Settings) -> int:
    if requested is None:
        requested = settings.session_timeout_default_ms
    return max(settings.session_timeout_min_ms, min(settings.session_timeout_max_ms, requested))


def heartbeat_interval(session_timeout_ms: int, settings: Settings) -> int:
    """A third of the session at most, so two lost heartbeats never expire a member."""
    return max(1, min(settings.heartbeat_interval_ms, session_timeout_ms // 3))


def _requested_subscription(request: HeartbeatRequest) -> tuple[list[str], str | None] | None:
    if request.subscribed_topics is None and request.subscribed_topic_regex is None:
        return None
    return sorted(set(request.subscribed_topics or [])), request.subscribed_topic_regex


def _reply(member: MemberRow, settings: Settings) -> HeartbeatReply:
    return HeartbeatReply(
        member_id=member.member_id,
        member_epoch=member.member_epoch,
        heartbeat_interval_ms=heartbeat_interval(member.session_timeout_ms, settings),
        session_timeout_ms=member.session_timeout_ms,
        assignment=[SliceJson.model_validate(s) for s in member.assigned],
    )


def _check_assignor(name: str | None) -> None:
    if name is not None and name not in ASSIGNORS:
        raise InvalidRequest(str(UnknownAssignorError(name)))


async def learn_subscribed_topics(
    engine: AsyncEngine, cluster: ClusterMetadata | None, request: HeartbeatRequest
) -> None:
    """Store partition counts of subscribed topics the coordinator has not seen yet, in a
    short transaction of its own, so the heartbeat's transaction assigns from the database."""
    subscription = _requested_subscription(request)
    if cluster is None or subscription is None:
        return
    topics, regex = subscription
    wanted = set(topics)
    try:
        if regex is not None:
            pattern = re.compile(regex)
            wanted |= {t for t in await cluster.list_topics() if pattern.fullmatch(t)}
        async with engine.connect() as connection:
            known = await metadata_repository.read_partition_counts(connection, wanted)
        missing = wanted - known.keys()
        if not missing:
            return
        counts = await cluster.partition_counts(sorted(missing))
    except KafkaClusterError as exc:
        # A heartbeat still works without Kafka; the refresh loop fills the counts in later.
        log.warning("partition counts unavailable", extra={"error": type(exc).__name__})
        return
    async with engine.begin() as connection:
        await metadata_repository.write_partition_counts(connection, counts)


# Stands for "every other member" in the holdings handed to ``reconcile_member``; member ids
# the coordinator issues always start with "m-".
_OTHERS = "*others*"


async def _reconcile_member(
    connection: AsyncConnection,
    member: MemberRow,
    reported: tuple[Slice, ...] | None,
    held_by_others: WireSlices | None = None,
) -> None:
    """Decide what ``member`` may own now; the caller has checked that the member saw its
    current assignment (its request carries its current epoch). Only the other members'
    holdings on the partitions this member targets matter, read as one union unless the
    caller already has it."""
    target = from_wire(member.target)
    others = held_by_others
    if others is None:
        others = await repository.held_by_others(
            connection,
            member.group_id,
            member.member_id,
            sorted({piece.topic_partition for piece in target}),
        )
    mine = MemberHolding(
        owned=from_wire(member.owned),
        assigned=from_wire(member.assigned),
        member_epoch=member.member_epoch,
    )
    owned = mine.owned
    if reported is not None:
        owned = accept_reported_owned(reported, mine)
        if owned != normalize_slices(reported):
            log.warning(
                "member reported slices it was never assigned; ignored",
                extra={"group_id": member.group_id, "member_id": member.member_id},
            )
    holdings = {
        _OTHERS: MemberHolding(owned=from_wire(others)),
        member.member_id: MemberHolding(owned, mine.assigned, mine.member_epoch),
    }
    decision = reconcile_member(member.member_id, holdings, target)
    # What was assignable until now and is not any more may have been started after the
    # request was sent: it stays held until a later report leaves it out.
    revoked = subtract_slices(mine.assigned, decision.assigned)
    member.owned = canonical_wire(union_slices(owned, revoked))
    if decision.member_epoch != member.member_epoch:
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = decision.member_epoch
        member.assigned = canonical_wire(decision.assigned)


@lru_cache(maxsize=16)
def _autocommit(engine: AsyncEngine) -> AsyncEngine:
    """The engine's pool without transactions; made once, since deriving it costs more than
    the statement it serves."""
    return engine.execution_options(isolation_level="AUTOCOMMIT")


async def stable_heartbeat(
    engine: AsyncEngine, group_id: str, request: HeartbeatRequest, settings: Settings
) -> bytes | None:
    """The reply to a heartbeat that only renews a stable member's session, as JSON, or None
    when the request needs :func:`heartbeat`. The common case by far, so it is one statement
    on its own (autocommit: no transaction to begin and commit) and builds its reply without
    decoding the stored assignment."""
    if request.member_epoch <= JOIN_EPOCH or request.member_id is None:
        return None
    # Compared as sent: a member echoing its assignment sends it in the stored order, and
    # anything else falls through to the full path, which normalizes.
    owned_json = (
        None if request.owned is None else json.dumps([s.model_dump() for s in request.owned])
    )
    session_timeout = (
        None
        if request.session_timeout_ms is None
        else clamp_session_timeout(request.session_timeout_ms, settings)
    )
    async with _autocommit(engine).connect() as connection:
        stable = await repository.extend_stable_session(
            connection,
            group_id,
            request.member_id,
            request.member_epoch,
            owned_json,
            _requested_subscription(request),
            request.assignor,
            request.allow_individual_commit,
            session_timeout,
        )
    if stable is None:
        return None
    return (
        b'{"member_id":%s,"member_epoch":%d,"heartbeat_interval_ms":%d,'
        b'"session_timeout_ms":%d,"assignment":%s}'
        % (
            json.dumps(request.member_id).encode(),
            request.member_epoch,
            heartbeat_interval(stable.session_timeout_ms, settings),
            stable.session_timeout_ms,
            stable.assigned_json.encode(),
        )
    )


async def heartbeat(
    connection: AsyncConnection,
    group_id: str,
    request: HeartbeatRequest,
    settings: Settings,
    client_host: str | None,
) -> HeartbeatReply:
    subscription = _requested_subscription(request)
    session_timeout = (
        None
        if request.session_timeout_ms is None
        else clamp_session_timeout(request.session_timeout_ms, settings)
    )
    _check_assignor(request.assignor)

    group = await _lock_group(connection, group_id)
    if request.member_epoch > JOIN_EPOCH:
        reported = None if request.owned is None else _request_slices(request.owned)
        member = await _heartbeat_locked(
            connection, group, request, reported, subscription, session_timeout, settings
        )
        return _reply(member, settings)
    reasons = expiry_reasons(await reap_locked(connection, group_id))
    if request.member_epoch == LEAVE_EPOCH:
        return await _leave(connection, group, request, settings, reasons)
    members = await read_members(connection, group_id)
    member, is_new = await _join(
        connection, group_id, members, request, settings, client_host, reasons
    )
    settled = group
    if reasons or group.rebalance_requested:
        settled = await settle_group(
            connection,
            group,
            members,
            settings,
            reasons,
            unsaved=member.member_id if is_new else None,
        )
    # A join's report of owned slices predates its new epoch: a rejoining member keeps what
    # it held until its first heartbeat at that epoch (``_take_over_held``).
    await _reconcile_member(connection, member, None)
    if is_new:
        await repository.insert_member(connection, member)
    else:
        await repository.save_member(connection, member, heartbeat=True)
    await save_group(connection, group, settled)
    return _reply(member, settings)


# Statement cancelled (statement_timeout) or lock not available (lock_timeout).
_GAVE_UP_WAITING = {"57014", "55P03"}


async def _lock_group(connection: AsyncConnection, group_id: str) -> GroupRow:
    """The group's row lock; a wait cut short by the database's timeouts is an overloaded
    group, which the client should retry, not an internal error."""
    try:
        return await repository.lock_group(connection, group_id)
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) not in _GAVE_UP_WAITING:
            raise
        log.warning("group lock not granted in time", extra={"group_id": group_id})
        raise ServiceUnavailable(
            f"group '{group_id}' is busy; retry the heartbeat shortly"
        ) from None


async def _heartbeat_locked(
    connection: AsyncConnection,
    group: GroupRow,
    request: HeartbeatRequest,
    reported: tuple[Slice, ...] | None,
    subscription: tuple[list[str], str | None] | None,
    session_timeout: int | None,
    settings: Settings,
) -> MemberRow:
    """A heartbeat of an existing member under its group's lock: three statements in the
    common case (lock, read, write), a reassignment only when something changed."""
    assert request.member_id is not None  # the schema requires it for epochs other than 0
    view = await repository.reap_and_read_member(connection, group.group_id, request.member_id)
    log_expired(group.group_id, view.expired)
    reasons = expiry_reasons(view.expired)
    member = _check_member(group.group_id, view.member, request)
    acknowledged = request.member_epoch == member.member_epoch
    _apply_member_fields(member, request, subscription, session_timeout, reasons)
    held_by_others: WireSlices | None = view.held_by_others
    settled = group
    if reasons or group.rebalance_requested:
        members = await read_members(connection, group.group_id)
        members[member.member_id] = member
        settled = await settle_group(connection, group, members, settings, reasons)
        held_by_others = None  # the target moved: read the others on its partitions again
    if acknowledged:
        await _reconcile_member(connection, member, reported, held_by_others)
    await repository.save_member(connection, member, heartbeat=True)
    await save_group(connection, group, settled)
    return member


def _check_member(group_id: str, member: MemberRow | None, request: HeartbeatRequest) -> MemberRow:
    """The heartbeating member, judged by the same fence as its commits; ``member`` was read
    live (expired members were reaped first)."""
    assert request.member_id is not None  # the schema requires it for epochs other than 0
    standing = (
        None
        if member is None
        else MemberStanding(member.member_epoch, member.previous_member_epoch, alive=True)
    )
    refused = member_refusal(group_id, request.member_id, request.member_epoch, standing)
    if refused is not None:
        raise refused
    assert member is not None
    return member


def _apply_member_fields(
    member: MemberRow,
    request: HeartbeatRequest,
    subscription: tuple[list[str], str | None] | None,
    session_timeout: int | None,
    reasons: list[str],
) -> None:
    if subscription is not None and subscription != (
        sorted(member.subscribed_topics),
        member.subscribed_topic_regex,
    ):
        member.subscribed_topics, member.subscribed_topic_regex = subscription
        reasons.append("subscription changed")
    if (
        request.allow_individual_commit is not None
        and request.allow_individual_commit != member.allow_individual_commit
    ):
        member.allow_individual_commit = request.allow_individual_commit
        reasons.append("member switches changed")
    if request.assignor is not None and request.assignor != member.assignor:
        member.assignor = request.assignor
        reasons.append("assignor changed")
    if session_timeout is not None:
        member.session_timeout_ms = session_timeout
    if request.client_id is not None:
        member.client_id = request.client_id


async def _join(
    connection: AsyncConnection,
    group_id: str,
    members: dict[str, MemberRow],
    request: HeartbeatRequest,
    settings: Settings,
    client_host: str | None,
    reasons: list[str],
) -> tuple[MemberRow, bool]:
    """A new member, a member rejoining in place after being fenced, or a static member
    taking its old place. Returns the member and whether its row is new."""
    subscription = _requested_subscription(request) or ([], None)
    session_timeout = clamp_session_timeout(request.session_timeout_ms, settings)
    if request.member_id is not None and request.member_id in members:
        member = members[request.member_id]
        _take_over_held(member)
        member.client_host = client_host
        _apply_member_fields(member, request, subscription, session_timeout, reasons)
        log.info("member rejoined", extra={"group_id": group_id, "member_id": member.member_id})
        return member, False
    predecessor = next(
        (
            m
            for m in members.values()
            if request.instance_id is not None and m.instance_id == request.instance_id
        ),
        None,
    )
    member = MemberRow(
        group_id=group_id,
        member_id=f"m-{uuid.uuid4().hex}",
        instance_id=request.instance_id,
        client_id=request.client_id,
        client_host=client_host,
        member_epoch=FIRST_MEMBER_EPOCH,
        previous_member_epoch=FIRST_MEMBER_EPOCH,
        subscribed_topics=subscription[0],
        subscribed_topic_regex=subscription[1],
        assignor=request.assignor,
        allow_individual_commit=(
            True if request.allow_individual_commit is None else request.allow_individual_commit
        ),
        session_timeout_ms=session_timeout,
        owned=[],
        assigned=[],
        target=[],
    )
    if predecessor is not None:
        # Static membership: the restarted instance inherits its predecessor's place and
        # target without a rebalance; the predecessor's commits are fenced from now on.
        del members[predecessor.member_id]
        await repository.delete_member(connection, group_id, predecessor.member_id)
        member.owned, member.assigned = predecessor.owned, predecessor.assigned
        member.target = predecessor.target
        member.member_epoch = predecessor.member_epoch
        _take_over_held(member)
        if (predecessor.subscribed_topics, predecessor.subscribed_topic_regex) != subscription or (
            predecessor.allow_individual_commit != member.allow_individual_commit
        ):
            reasons.append("subscription changed")
        log.info(
            "static member replaced",
            extra={
                "group_id": group_id,
                "instance_id": request.instance_id,
                "member_id": member.member_id,
                "replaced_member_id": predecessor.member_id,
            },
        )
    else:
        reasons.append("member joined")
        log.info("member joined", extra={"group_id": group_id, "member_id": member.member_id})
    members[member.member_id] = member
    return member, True


def _take_over_held(member: MemberRow) -> None:
    """A (re)joining process may still hold anything its predecessor was given, until its
    first report at the new epoch says otherwise; the epoch bump fences the old one."""
    member.owned = canonical_wire(union_slices(from_wire(member.owned), from_wire(member.assigned)))
    member.assigned = []
    member.member_epoch += 1
    member.previous_member_epoch = member.member_epoch


async def _leave(
    connection: AsyncConnection,
    group: GroupRow,
    request: HeartbeatRequest,
    settings: Settings,
    reasons: list[str],
) -> HeartbeatReply:
    """Leaving is idempotent: a retried leave whose first reply was lost succeeds too."""
    assert request.member_id is not None  # the schema requires it for a leave
    leaving = await repository.read_member(connection, group.group_id, request.member_id)
    if leaving is not None:
        await repository.delete_member(connection, group.group_id, request.member_id)
        reasons.append("member left")
        log.info("member left", extra={"group_id": group.group_id, "member_id": request.member_id})
    if reasons or group.rebalance_requested:
        members = await read_members(connection, group.group_id)
        settled = await settle_group(connection, group, members, settings, reasons)
        await save_group(connection, group, settled)
    session_timeout = leaving.session_timeout_ms if leaving else settings.session_timeout_default_ms
    return HeartbeatReply(
        member_id=request.member_id,
        member_epoch=LEAVE_EPOCH,
        heartbeat_interval_ms=heartbeat_interval(session_timeout, settings),
        session_timeout_ms=session_timeout,
        assignment=[],
    )
