"""The heartbeat route's shell: join, heartbeat and leave (docs/design.md §5, in the manner of
KIP-848). Protocol decisions are recorded in docs/membership.md and made by
``coordinator.core.heartbeat.heartbeat_step``; this module reads the facts it asks for under
the group's row lock, inside the caller's transaction (never committing), stores what it
decided and answers. Several coordinator replicas can share one database because no
membership state lives anywhere else.

One kind of heartbeat skips the step: a stable member renewing its session, one statement
(:func:`stable_renewal`, batched by :func:`renewals_of`) whose guard matches only when the step
would change nothing. Another runs the step without the lock: one whose outcome writes only its
own member row (:func:`unlocked_heartbeat`), stored only if what it read is unchanged. Which of
these paths serves a request is decided in ``coordinator/groups/serve.py``.

A heartbeat may also carry the member's stuck calls (docs/api.md, "Stuck calls") and the
address it serves queries on ("Member endpoints"): stored on its row in the same transaction
as the rest of the heartbeat, never read by the step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache

import asyncpg
from pydantic import TypeAdapter
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from client.protocol.epochs import JOIN_EPOCH, LEAVE_EPOCH
from coordinator.core.assignment import slices_from_wire, slices_to_wire
from coordinator.core.assignors import ASSIGNORS, UnknownAssignorError
from coordinator.core.handoff import Hold
from coordinator.core.heartbeat import (
    SENT_FIELDS,
    HeartbeatFacts,
    HeartbeatOutcome,
    MemberRequest,
    MembersNeeded,
    heartbeat_step,
    own_row_outcome,
)
from coordinator.core.membership import GroupRecord, TopicSubscription
from coordinator.core.quotas import WHOLE_COORDINATOR, group_refusals
from coordinator.core.topic_pattern import matching_topics
from coordinator.db import quotas as quota_store
from coordinator.db.engine import driver_connection
from coordinator.errors import InvalidRequest, ServiceUnavailable
from coordinator.groups import (
    endpoint_repository,
    metadata_repository,
    repository,
    stuck_repository,
    unlocked_repository,
)
from coordinator.groups.renewals import SessionRenewals
from coordinator.groups.schemas import HeartbeatReply, HeartbeatRequest, IdleReply, SliceJson
from coordinator.groups.settle import (
    announce,
    log_expired,
    notice_of,
    read_members,
    read_topic_facts,
    reap_locked,
    record_rebalance,
    save_group,
    session_limits,
)
from coordinator.groups.stored_topics import StoredTopics
from coordinator.kafka import ClusterMetadata, KafkaClusterError
from coordinator.settings import Settings

log = logging.getLogger(__name__)


def heartbeat_interval(session_timeout_ms: int, settings: Settings) -> int:
    """A third of the session at most, so two lost heartbeats never expire a member."""
    return max(1, min(settings.heartbeat_interval_ms, session_timeout_ms // 3))


class _JoinOrderIds:
    """Member ids that sort after every id this process issued before (the clock's
    nanoseconds, fixed width and never repeated, then 64 random bits that keep ids of
    different replicas apart).

    The round-robin assignor deals in member-id order, so with ids in join order a newcomer is
    dealt last and moves only the members of the partition it joins, not every member after
    its place in a random order (docs/membership.md, "Subscriptions"). Replicas' clocks that
    disagree, or one stepped back, only cost movement, never safety."""

    def __init__(self) -> None:
        self._last_ns = 0

    def issue(self) -> str:
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return f"m-{self._last_ns:016x}{secrets.token_hex(8)}"


new_member_id = _JoinOrderIds().issue


def _requested_subscription(request: HeartbeatRequest) -> TopicSubscription | None:
    if request.subscribed_topics is None and request.subscribed_topic_regex is None:
        return None
    return TopicSubscription.of(request.subscribed_topics, request.subscribed_topic_regex)


def _reply(outcome: HeartbeatOutcome, settings: Settings) -> HeartbeatReply:
    return HeartbeatReply(
        member_id=outcome.reply_member_id,
        member_epoch=outcome.reply_epoch,
        heartbeat_interval_ms=heartbeat_interval(outcome.reply_session_timeout_ms, settings),
        session_timeout_ms=outcome.reply_session_timeout_ms,
        assignment=[SliceJson.model_validate(s) for s in slices_to_wire(outcome.reply_assignment)],
        idle=(
            None
            if outcome.reply_idle is None
            else IdleReply(
                switch=outcome.reply_idle.switch,
                topics=list(outcome.reply_idle.topics),
                message=outcome.reply_idle.message,
            )
        ),
    )


def _check_assignor(name: str | None) -> None:
    if name is not None and name not in ASSIGNORS:
        raise InvalidRequest(str(UnknownAssignorError(name)))


async def learn_subscribed_topics(
    engine: AsyncEngine,
    cluster: ClusterMetadata | None,
    request: HeartbeatRequest,
    stored: StoredTopics,
) -> None:
    """Store partition counts of subscribed topics the coordinator has not seen yet, in a
    short transaction of its own, so the heartbeat's transaction assigns from the database.
    Topics ``stored`` saw lately are not read again (``coordinator/groups/stored_topics.py``)."""
    subscription = _requested_subscription(request)
    if cluster is None or subscription is None:
        return
    wanted = set(subscription.topics)
    try:
        if subscription.regex is not None:
            wanted |= matching_topics(subscription.regex, await cluster.list_topics())
        if stored.all_stored(wanted):
            return
        async with engine.connect() as connection:
            known = await metadata_repository.read_partition_counts(connection, wanted)
        stored.remember(known)
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
    stored.remember(counts)


# A member's owned slices as JSON, in the order sent.
_OWNED = TypeAdapter(list[SliceJson])


@lru_cache(maxsize=16)
def renewals_of(engine: AsyncEngine) -> SessionRenewals:
    """The engine's batched renewals, one per engine for the process's life."""
    return SessionRenewals(engine)


def stable_renewal(
    group_id: str, request: HeartbeatRequest, settings: Settings
) -> repository.Renewal:
    """The renewal of a heartbeat that ``coordinator.groups.serve.first_path`` sends to the
    renewal, whose statement matches only while the member is stable."""
    assert request.member_id is not None  # first_path
    # Compared as sent: a member echoing its assignment sends it in the stored order, and
    # anything else falls through to the full path, which normalizes.
    owned_json = None if request.owned is None else _OWNED.dump_json(request.owned).decode()
    sent = {field.name: getattr(request, field.name) for field in SENT_FIELDS}
    if request.session_timeout_ms is not None:
        sent["session_timeout_ms"] = session_limits(settings).clamp(request.session_timeout_ms)
    subscription = _requested_subscription(request)
    return repository.Renewal(
        group_id,
        request.member_id,
        request.member_epoch,
        owned_json,
        None if subscription is None else (list(subscription.topics), subscription.regex),
        sent,
    )


def stable_reply(
    request: HeartbeatRequest,
    stable: repository.StableHeartbeat,
    settings: Settings,
    *,
    heartbeat_now: bool,
) -> bytes:
    """The JSON reply to a heartbeat the renewal served."""
    return (
        b'{"member_id":%s,"member_epoch":%d,"heartbeat_interval_ms":%d,'
        b'"session_timeout_ms":%d,"assignment":%s,"heartbeat_now":%s}'
        % (
            json.dumps(request.member_id).encode(),
            request.member_epoch,
            heartbeat_interval(stable.session_timeout_ms, settings),
            stable.session_timeout_ms,
            stable.assigned_json.encode(),
            b"true" if heartbeat_now else b"false",
        )
    )


@dataclass(frozen=True, slots=True)
class LockedAnswer:
    """The locked path's reply; ``hold``: whether it may wait for a change once the
    transaction has committed; ``unsettled``: whether the member's next heartbeat needs the
    locked path again (``HeartbeatOutcome.leaves_member_unsettled``)."""

    reply: HeartbeatReply
    hold: Hold | None
    unsettled: bool


async def heartbeat(
    connection: AsyncConnection,
    group_id: str,
    request: HeartbeatRequest,
    settings: Settings,
    client_host: str | None,
    scope: str = WHOLE_COORDINATOR,
) -> LockedAnswer:
    """A heartbeat the stable path did not answer: read the facts under the group's lock,
    let the core decide, store the outcome. ``scope``: the tenant a new group counts against
    (``coordinator.core.quotas``)."""
    _check_assignor(request.assignor)
    group = await _lock_group(connection, group_id, request.member_epoch, scope, settings)
    facts = _facts(group, request, settings, client_host)
    if request.member_epoch > JOIN_EPOCH:
        assert request.member_id is not None  # the schema requires it for epochs other than 0
        # Three statements in the common case (lock, read, write): the member and what the
        # others hold on its partitions come in one round trip.
        view = await repository.reap_and_read_member(connection, group_id, request.member_id)
        log_expired(group_id, view.expired)
        facts = replace(
            facts,
            expired=tuple(view.expired),
            member=view.member,
            held_by_others=view.held_by_others,
        )
    else:
        facts = replace(facts, expired=tuple(await reap_locked(connection, group_id)))
        if request.member_epoch == LEAVE_EPOCH:
            assert request.member_id is not None  # the schema requires it for a leave
            leaving = await repository.read_member(connection, group_id, request.member_id)
            facts = replace(facts, member=leaving)
    outcome = await _decide(connection, facts, settings)
    await _store(connection, group, outcome)
    if request.stuck is not None and outcome.member is not None:
        await stuck_repository.save_stuck(
            connection,
            group_id,
            outcome.member.member_id,
            [call.model_dump() for call in request.stuck],
        )
    if request.endpoint is not None and outcome.member is not None:
        await endpoint_repository.save_endpoint(
            connection, group_id, outcome.member.member_id, request.endpoint
        )
    for note in outcome.notes:
        log.log(logging.WARNING if note.warning else logging.INFO, note.message, extra=note.fields)
    record_rebalance(group_id, outcome.rebalance)
    return LockedAnswer(_reply(outcome, settings), outcome.hold, outcome.leaves_member_unsettled)


def _facts(
    group: GroupRecord, request: HeartbeatRequest, settings: Settings, client_host: str | None
) -> HeartbeatFacts:
    return HeartbeatFacts(
        group=group,
        request=member_request(request, client_host),
        session_limits=session_limits(settings),
        default_assignor=settings.default_assignor,
        new_member_id=new_member_id(),
        max_members=settings.max_members_per_group,
    )


@lru_cache(maxsize=16)
def _autocommit(engine: AsyncEngine) -> AsyncEngine:
    return engine.execution_options(isolation_level="AUTOCOMMIT")


async def unlocked_heartbeat(
    engine: AsyncEngine,
    group_id: str,
    request: HeartbeatRequest,
    settings: Settings,
    client_host: str | None,
) -> LockedAnswer | None:
    """The locked path's answer, decided and stored without the group's turn or lock, when
    it writes only the member's own row; None when the locked path must serve the request
    (only for a request ``coordinator.groups.serve.first_path`` lets skip the turn).

    A join's hand-off is a chain of heartbeats: each retargeted member's revoke, then its
    release, then the grants that the releases allow. Under the group's turn they ran one at
    a time, so a newcomer waited for every member of the partition. None of them changes
    anything but the member's own row (``own_row_outcome`` says why that is safe to
    decide on a snapshot), so each is the same step on one snapshot, stored by a write that
    lands only if the member's and the group's rows are still as read, between two locked
    transactions of the group (``coordinator/groups/unlocked_repository.py``), with the
    notice of its change. Anything else (a join, a leave, a rebalance, a refusal, an expired
    member to reap) is left to the locked path, which decides again under the lock.
    docs/membership.md, "Heartbeats without the group's turn"."""
    async with _autocommit(engine).connect() as connection:
        assert request.member_id is not None  # first_path
        view = await unlocked_repository.read_view(connection, group_id, request.member_id)
        if view is None or view.any_expired:
            return None
        facts = replace(
            _facts(view.group, request, settings, client_host),
            member=view.member,
            held_by_others=view.held_by_others,
        )
        outcome = own_row_outcome(facts)
        if outcome is None:
            return None
        assert outcome.member is not None  # own_row_outcome
        with _busy_group_refused(group_id):
            saved = await unlocked_repository.save_if_unchanged(
                connection, view, outcome.member, notice_of(outcome.change)
            )
        if not saved:
            return None
    return LockedAnswer(_reply(outcome, settings), outcome.hold, outcome.leaves_member_unsettled)


def member_request(request: HeartbeatRequest, client_host: str | None) -> MemberRequest:
    """The request as the step reads it; public so that the stable path's guard can be held
    to the step on the very requests the route gets (tests/groups/test_stable_guard.py)."""
    return MemberRequest(
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        client_id=request.client_id,
        client_host=client_host,
        subscription=_requested_subscription(request),
        assignor=request.assignor,
        allow_individual_commit=request.allow_individual_commit,
        session_timeout_ms=request.session_timeout_ms,
        owned=(
            None
            if request.owned is None
            else slices_from_wire(s.model_dump() for s in request.owned)
        ),
        standbys=(
            None
            if request.standbys is None
            else slices_from_wire(s.model_dump() for s in request.standbys)
        ),
    )


# The step asks for the group's members, then for its topics' facts, at most once each.
_MOST_STEPS = 3


async def _decide(
    connection: AsyncConnection, facts: HeartbeatFacts, settings: Settings
) -> HeartbeatOutcome:
    """Run the step, reading what it asks for until it decides."""
    for _ in range(_MOST_STEPS):
        result = heartbeat_step(facts)
        if isinstance(result, HeartbeatOutcome):
            return result
        if isinstance(result, MembersNeeded):
            facts = replace(facts, members=await read_members(connection, facts.group.group_id))
        else:
            facts = replace(facts, topics=await read_topic_facts(connection, result, settings))
    raise AssertionError("the heartbeat step asked for the same facts twice")


async def _store(
    connection: AsyncConnection, before: GroupRecord, outcome: HeartbeatOutcome
) -> None:
    for member_id in outcome.removed:
        await repository.delete_member(connection, before.group_id, member_id)
    await repository.save_targets(connection, before.group_id, outcome.targets)
    # The change's notice goes with the member's own row, when there is one (a leave has none).
    if outcome.member is None:
        await announce(connection, outcome.change)
    elif outcome.inserted:
        await repository.insert_member(connection, outcome.member, notice_of(outcome.change))
    else:
        await repository.save_member(
            connection, outcome.member, heartbeat=True, notice=notice_of(outcome.change)
        )
    await save_group(connection, before, outcome.group)


# Statement cancelled (statement_timeout) or lock not available (lock_timeout).
_GAVE_UP_WAITING = {"57014", "55P03"}


async def _lock_group(
    connection: AsyncConnection, group_id: str, member_epoch: int, scope: str, settings: Settings
) -> GroupRecord:
    """The group's row lock (:func:`_busy_group_refused` says what a long wait for it gives).

    Only a join creates a missing group, and only within its tenant's cap. Anything else
    about a group that does not exist (a heartbeat, which the fence refuses, or a leave,
    which has nothing to do) is decided on a group that is never stored.
    """
    with _busy_group_refused(group_id):
        group = await repository.find_group(connection, group_id, lock=True)
        if group is not None:
            return group
        if member_epoch != JOIN_EPOCH:
            return GroupRecord(group_id, None, 0, False, None)
        driver = await driver_connection(connection)
        stored = await quota_store.lock_scopes(driver, [scope])
        cap = settings.max_groups_per_prefix
        refused = group_refusals([(group_id, scope)], stored, cap)[group_id]
        if refused is not None:
            raise refused
        await quota_store.create_groups(driver, [group_id])
        # Locked whether this transaction or a concurrent one created it.
        return await repository.lock_group(connection, group_id)


@contextlib.contextmanager
def _busy_group_refused(group_id: str) -> Iterator[None]:
    """A wait for the group's row lock cut short by the database's timeouts is an overloaded
    group, which the client should retry, not an internal error."""
    try:
        yield
    except (DBAPIError, asyncpg.PostgresError) as exc:
        # Creating a group runs on the driver connection, whose errors come unwrapped.
        cause = exc.orig if isinstance(exc, DBAPIError) else exc
        if getattr(cause, "sqlstate", None) not in _GAVE_UP_WAITING:
            raise
        log.warning("group lock not granted in time", extra={"group_id": group_id})
        raise ServiceUnavailable(
            f"group '{group_id}' is busy; retry the heartbeat shortly"
        ) from None
