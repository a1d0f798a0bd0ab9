"""The heartbeat route's shell: join, heartbeat and leave (DESIGN §5, in the manner of
KIP-848). Protocol decisions are recorded in docs/membership.md and made by
``coordinator.core.heartbeat.heartbeat_step``; this module reads the facts it asks for under
the group's row lock, inside the caller's transaction (never committing), stores what it
decided and answers. Several coordinator replicas can share one database because no
membership state lives anywhere else.

One kind of heartbeat skips the step: a stable member renewing its session, one statement
(:func:`stable_heartbeat`) whose guard matches only when the step would change nothing.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import replace
from functools import lru_cache

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from client.protocol.epochs import JOIN_EPOCH, LEAVE_EPOCH
from coordinator.core.assignment import slices_from_wire, slices_to_wire
from coordinator.core.assignors import ASSIGNORS, UnknownAssignorError
from coordinator.core.heartbeat import (
    HeartbeatFacts,
    HeartbeatOutcome,
    MemberRequest,
    MembersNeeded,
    heartbeat_step,
)
from coordinator.core.membership import GroupRecord, TopicSubscription
from coordinator.core.topic_pattern import matching_topics
from coordinator.errors import InvalidRequest, ServiceUnavailable
from coordinator.groups import metadata_repository, repository
from coordinator.groups.schemas import HeartbeatReply, HeartbeatRequest, SliceJson
from coordinator.groups.settle import (
    log_expired,
    read_members,
    read_topic_facts,
    reap_locked,
    record_rebalance,
    save_group,
    session_limits,
)
from coordinator.kafka import ClusterMetadata, KafkaClusterError
from coordinator.settings import Settings

log = logging.getLogger(__name__)


def heartbeat_interval(session_timeout_ms: int, settings: Settings) -> int:
    """A third of the session at most, so two lost heartbeats never expire a member."""
    return max(1, min(settings.heartbeat_interval_ms, session_timeout_ms // 3))


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
    wanted = set(subscription.topics)
    try:
        if subscription.regex is not None:
            wanted |= matching_topics(subscription.regex, await cluster.list_topics())
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
        else session_limits(settings).clamp(request.session_timeout_ms)
    )
    subscription = _requested_subscription(request)
    async with _autocommit(engine).connect() as connection:
        stable = await repository.extend_stable_session(
            connection,
            group_id,
            request.member_id,
            request.member_epoch,
            owned_json,
            None if subscription is None else (list(subscription.topics), subscription.regex),
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
    """A heartbeat the stable path did not answer: read the facts under the group's lock,
    let the core decide, store the outcome."""
    _check_assignor(request.assignor)
    group = await _lock_group(connection, group_id)
    facts = HeartbeatFacts(
        group=group,
        request=_member_request(request, client_host),
        session_limits=session_limits(settings),
        default_assignor=settings.default_assignor,
        new_member_id=f"m-{uuid.uuid4().hex}",
    )
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
    for note in outcome.notes:
        log.log(logging.WARNING if note.warning else logging.INFO, note.message, extra=note.fields)
    record_rebalance(group_id, outcome.rebalance)
    return _reply(outcome, settings)


def _member_request(request: HeartbeatRequest, client_host: str | None) -> MemberRequest:
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
    if outcome.member is not None:
        if outcome.inserted:
            await repository.insert_member(connection, outcome.member)
        else:
            await repository.save_member(connection, outcome.member, heartbeat=True)
    await save_group(connection, before, outcome.group)


# Statement cancelled (statement_timeout) or lock not available (lock_timeout).
_GAVE_UP_WAITING = {"57014", "55P03"}


async def _lock_group(connection: AsyncConnection, group_id: str) -> GroupRecord:
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
