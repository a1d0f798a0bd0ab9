"""The stable heartbeat's SQL guard against the pure step, on generated member states.

``stable_heartbeat`` renews a session with one guarded ``UPDATE`` and skips the step. That is
safe only if the guard matches exactly the heartbeats the step answers with nothing to store
but the session (no field of the member, no group state, no target; the same epoch and
assignment) for a member with nothing to reconcile, whose reply may wait for a change as the
stable path's does. Both are asked here about the same stored member and request: the guard
over a real migrated Postgres through the route's own entry point, the step in memory. A
guard that matched more would renew members whose request changes something and leave the
change unstored; one that matched less would send the common heartbeat down the locked
path. "Exactly" holds wherever the member sends its owned slices in their stored order: the
guard compares them as sent, and any other order falls through to the full path on purpose.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import TypeVar

from fastapi import FastAPI
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from client.protocol.keyspace import KeyRange
from coordinator.core.assignment import Slice, slices_from_wire, slices_to_wire
from coordinator.core.handoff import Hold
from coordinator.core.heartbeat import HeartbeatFacts, HeartbeatOutcome, heartbeat_step
from coordinator.core.membership import GroupRecord, MemberRecord, TopicFacts
from coordinator.errors import KeyrangeError
from coordinator.groups import repository
from coordinator.groups.heartbeat import member_request
from coordinator.groups.schemas import HeartbeatRequest
from coordinator.groups.serve import stable_heartbeat
from coordinator.groups.settle import session_limits
from coordinator.settings import Settings

T = TypeVar("T")
_FULL = KeyRange.full()
_LOWER, _UPPER = _FULL.split(2)
# Few holdings, so that owned, assigned and target are often equal and often not.
_HOLDINGS: list[tuple[Slice, ...]] = [
    (),
    (Slice("t", 0, _FULL),),
    (Slice("t", 0, _LOWER),),
    (Slice("t", 0, _UPPER), Slice("t", 1, _FULL)),
]
# The hold the route gives every reply of the stable path: a stable member is not short of
# its target.
_STABLE_HOLD = Hold(short_of_target=False)
_TOPICS = TopicFacts(
    partition_counts={"t": 2, "u": 1},
    accept_range_fetch={"t": True},
    default_accept_range_fetch=False,
    accept_individual_commit=True,
)


@dataclass(frozen=True)
class Case:
    """A stored member and group, whether the member is still live, and its heartbeat."""

    member: MemberRecord
    rebalance_requested: bool
    live: bool
    request: HeartbeatRequest
    # The request's owned slices are in the order the coordinator stores (and replies) them.
    owned_as_stored: bool


# What a case may change from a stable member's echo of its own state; most cases change
# nothing or one thing, so both answers of the guard are common and each condition is met
# alone as well as together with others.
_CHANGES = (
    "assigned",
    "target",
    "rebalance",
    "expired",
    "epoch",
    "client_id",
    "subscription",
    "assignor",
    "allow",
    "session",
    "owned",
)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    changes = draw(
        st.one_of(
            st.just(frozenset[str]()),
            st.lists(st.sampled_from(_CHANGES), min_size=1, max_size=3).map(frozenset),
        )
    )

    def either(stable: T, changed: st.SearchStrategy[T], field: str) -> T:
        return draw(changed) if field in changes else stable

    def sent(stable: T, changed: st.SearchStrategy[T], field: str) -> T | None:
        """A request field: absent (unchanged) or the stored value, unless ``field`` changes."""
        return draw(changed) if field in changes else draw(st.sampled_from([None, stable]))

    epoch = draw(st.integers(1, 4))
    holding = draw(st.sampled_from(_HOLDINGS))
    member = MemberRecord(
        group_id="",
        member_id=f"m-{uuid.uuid4().hex}",
        instance_id=None,
        client_id=draw(st.sampled_from([None, "app"])),
        client_host=None,
        member_epoch=epoch,
        previous_member_epoch=draw(st.sampled_from([max(1, epoch - 1), epoch])),
        subscribed_topics=draw(st.sampled_from([("t",), ("t", "u")])),
        subscribed_topic_regex=draw(st.sampled_from([None, "t.*"])),
        assignor=draw(st.sampled_from([None, "range", "round-robin"])),
        allow_individual_commit=draw(st.booleans()),
        session_timeout_ms=draw(st.sampled_from([1_000, 3_000])),
        owned=holding,
        assigned=either(holding, st.sampled_from(_HOLDINGS), "assigned"),
        target=either(holding, st.sampled_from(_HOLDINGS), "target"),
    )
    owned_wire = slices_to_wire(either(holding, st.sampled_from(_HOLDINGS), "owned"))
    owned_as_stored = True
    if "owned" in changes and len(owned_wire) > 1 and draw(st.booleans()):
        owned_wire.reverse()
        owned_as_stored = False
    stored_topics = list(member.subscribed_topics)
    topics, regex = (
        draw(st.sampled_from([(["u", "t"], member.subscribed_topic_regex), (stored_topics, "u")]))
        if "subscription" in changes
        else draw(st.sampled_from([(None, None), (stored_topics, member.subscribed_topic_regex)]))
    )
    request = HeartbeatRequest(
        member_id=member.member_id,
        member_epoch=either(
            epoch,
            st.sampled_from([member.previous_member_epoch, epoch + 1, max(1, epoch - 2)]),
            "epoch",
        ),
        client_id=sent(member.client_id, st.just("other"), "client_id"),
        subscribed_topics=topics,
        subscribed_topic_regex=regex,
        assignor=sent(member.assignor, st.sampled_from(["range", "round-robin"]), "assignor"),
        allow_individual_commit=sent(member.allow_individual_commit, st.booleans(), "allow"),
        session_timeout_ms=sent(
            member.session_timeout_ms, st.sampled_from([100, 1_000, 3_000]), "session"
        ),
        owned=owned_wire if "owned" in changes else draw(st.sampled_from([None, owned_wire])),
    )
    return Case(
        member=member,
        rebalance_requested="rebalance" in changes,
        live="expired" not in changes,
        request=request,
        owned_as_stored=owned_as_stored,
    )


def step_only_renews(case: Case, group: GroupRecord, app_settings: Settings) -> bool:
    """Whether the pure step, given every fact it could ask for, answers this heartbeat with
    nothing to store but the renewed session, for a member with nothing to reconcile (it owns
    its assignment, which is its target): such a reply has no news, so it may wait for a
    change, as the stable path's replies do."""
    member = case.member if case.live else None
    facts = HeartbeatFacts(
        group=group,
        request=member_request(case.request, None),
        session_limits=session_limits(app_settings),
        default_assignor=app_settings.default_assignor,
        member=member,
        members={} if member is None else {member.member_id: member},
        topics=_TOPICS,
    )
    try:
        outcome = heartbeat_step(facts)
    except KeyrangeError:
        return False
    assert isinstance(outcome, HeartbeatOutcome), "given every fact, the step asks for nothing"
    return (
        member is not None
        and member.is_stable
        and outcome.member == member
        and outcome.group == group
        and not outcome.targets
        and outcome.rebalance is None
        and not outcome.removed
        and outcome.reply_epoch == case.request.member_epoch
        and outcome.reply_assignment == case.member.assigned
        and outcome.reply_session_timeout_ms == case.member.session_timeout_ms
        # The stable path's reply may wait for a change; the step's may too when the member
        # reports owning exactly its assignment (a report of anything else is news to act on).
        and (case.request.owned is None or outcome.hold == _STABLE_HOLD)
    )


async def store(app: FastAPI, case: Case) -> GroupRecord:
    async with app.state.engine.begin() as connection:
        created = await repository.lock_group(connection, case.member.group_id)
        group = replace(
            created,
            assignor=case.member.assignor,
            rebalance_requested=case.rebalance_requested,
            rebalance_reason="subscription changed" if case.rebalance_requested else None,
        )
        await repository.save_group(connection, group)
        await repository.insert_member(connection, case.member)
        if not case.live:
            await connection.execute(
                text(
                    "UPDATE members SET expires_at = now() - interval '1 second' "
                    "WHERE group_id = :group_id"
                ),
                {"group_id": case.member.group_id},
            )
    return group


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
async def test_the_stable_guard_matches_exactly_when_the_step_only_renews_the_session(
    coordinator_app: FastAPI, case: Case
) -> None:
    case = replace(case, member=replace(case.member, group_id=f"guard-{uuid.uuid4().hex}"))
    app_settings: Settings = coordinator_app.state.settings
    group = await store(coordinator_app, case)

    renewed = await stable_heartbeat(
        coordinator_app.state.engine, case.member.group_id, case.request, app_settings
    )

    only_renews = step_only_renews(case, group, app_settings)
    event(f"guard matched: {renewed is not None}, step only renews: {only_renews}")
    if case.owned_as_stored:
        assert (renewed is not None) == only_renews, f"guard and step disagree on {case}"
    else:
        assert renewed is None or only_renews, f"the guard took {case}"
    if renewed is not None:
        assert slices_from_wire(json.loads(renewed.assigned_json)) == case.member.assigned
        assert renewed.session_timeout_ms == case.member.session_timeout_ms
