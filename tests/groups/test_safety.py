"""The safety invariant (docs/design.md §5) under random joins, leaves, crashes and
partition growth: at no point do two live members hold overlapping key ranges of one
partition, and the group converges once the churn stops.

One simulation, two coordinators: the real heartbeat route over Postgres, and an in-memory
shell around the same pure step (``coordinator.core.heartbeat.heartbeat_step``) that the route
calls, on a simulated clock, so many more seeds and steps fit in a second.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import replace
from itertools import combinations
from typing import Any, Protocol

import httpx
import pytest
from fastapi import FastAPI

from client.protocol.keyspace import KeyRange, intersect, normalize, subtract
from coordinator.core.assignment import slices_from_wire, slices_to_wire
from coordinator.core.heartbeat import (
    HeartbeatFacts,
    HeartbeatOutcome,
    MemberRequest,
    MembersNeeded,
    heartbeat_step,
    held_by_others,
    own_row_outcome,
)
from coordinator.core.membership import (
    GroupRecord,
    MemberRecord,
    SessionLimits,
    TopicFacts,
    TopicSubscription,
    group_state,
)
from coordinator.errors import KeyrangeError
from coordinator.groups import metadata_repository, repository

SESSION_MS = 1_000
STEPS = 80
MAX_MEMBERS = 7
# Long enough for crashed sessions to expire and be reaped on a busy machine.
CONVERGENCE_S = 30

Holding = dict[tuple[str, int], list[KeyRange]]


def from_wire(slices: list[dict[str, Any]]) -> Holding:
    holding: Holding = {}
    for entry in slices:
        key = (entry["topic"], entry["partition"])
        holding[key] = normalize([*holding.get(key, []), *map(KeyRange.from_json, entry["ranges"])])
    return holding


def to_wire(holding: Holding) -> list[dict[str, Any]]:
    return [
        {"topic": t, "partition": p, "ranges": [r.to_json() for r in ranges]}
        for (t, p), ranges in sorted(holding.items())
        if ranges
    ]


def merged(left: Holding, right: Holding) -> Holding:
    return {k: normalize([*left.get(k, []), *right.get(k, [])]) for k in left.keys() | right.keys()}


def overlapping(left: Holding, right: Holding) -> list[tuple[str, int]]:
    clashes = []
    for key in left.keys() & right.keys():
        if normalize(left[key]) != subtract(left[key], right[key]):
            clashes.append(key)
    return clashes


class Coordinator(Protocol):
    """What the simulation needs of a coordinator; one is the real route, one in memory."""

    def now(self) -> float: ...

    async def heartbeat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]: ...

    async def describe(self) -> dict[str, Any]: ...

    async def grow_partitions(self, topic: str, count: int) -> None: ...

    async def pause(self, seconds: float) -> None: ...


class SimulatedMember:
    """A client process. It reports what it owns on its next heartbeat. A lazy one keeps
    revoked slices one heartbeat longer (finishing in-flight work); a late starter starts
    what a reply assigned only after sending its next heartbeat, so that report leaves the
    new slices out although it is about to own them. Without a successful heartbeat for a
    session it drops everything."""

    def __init__(
        self, name: str, coordinator: Coordinator, assignor: str, lazy: bool, late_start: bool
    ) -> None:
        self.name = name
        self.coordinator = coordinator
        self.assignor = assignor
        self.lazy = lazy
        self.late_start = late_start
        self.member_id: str | None = None
        self.epoch = 0
        self.owned: Holding = {}
        self.assignment: Holding = {}
        self.deadline = 0.0
        self.crashed = False
        self.left = False
        self.kept_revoked = False

    def holds(self) -> Holding:
        if self.crashed or self.left or self.coordinator.now() >= self.deadline:
            return {}
        return merged(self.owned, self.assignment)

    def _drop_everything(self) -> None:
        self.owned, self.assignment = {}, {}

    async def heartbeat(self, topics: list[str]) -> None:
        if self.coordinator.now() >= self.deadline:
            self._drop_everything()
        if self.member_id is None or self.epoch == 0:
            body: dict[str, Any] = {
                "member_epoch": 0,
                "member_id": self.member_id,
                "subscribed_topics": topics,
                "assignor": self.assignor,
                "session_timeout_ms": SESSION_MS,
                "owned": [],
            }
        else:
            body = {
                "member_id": self.member_id,
                "member_epoch": self.epoch,
                "owned": to_wire(self.owned),
            }
        sent_at = self.coordinator.now()
        status, answer = await self.coordinator.heartbeat(body)
        if status == 409:
            error = answer["error"]
            assert error in {"UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"}, answer
            self._drop_everything()
            self.epoch = 0
            if error == "UNKNOWN_MEMBER_ID":
                self.member_id = None
            return
        assert status == 200, answer
        self.member_id, self.epoch = answer["member_id"], answer["member_epoch"]
        self.deadline = sent_at + answer["session_timeout_ms"] / 1000
        if self.late_start:
            self.owned = merged(self.owned, self.assignment)
        self.assignment = from_wire(answer["assignment"])
        kept = {k: intersect(v, self.assignment.get(k, [])) for k, v in self.owned.items()}
        if self.lazy and kept != self.owned and not self.kept_revoked:
            self.kept_revoked = True
        else:
            self.owned = {k: v for k, v in kept.items() if v}
            self.kept_revoked = False
        if not self.late_start:
            self.owned = merged(self.owned, self.assignment)

    async def leave(self) -> None:
        self._drop_everything()
        self.left = True
        if self.member_id is not None:
            status, answer = await self.coordinator.heartbeat(
                {"member_id": self.member_id, "member_epoch": -1}
            )
            assert status == 200, answer


def assert_clients_disjoint(members: list[SimulatedMember], step: int) -> None:
    for first, second in combinations(members, 2):
        clashes = overlapping(first.holds(), second.holds())
        assert not clashes, f"step {step}: {first.name} and {second.name} both hold {clashes}"


async def assert_stored_disjoint(coordinator: Coordinator, step: int) -> dict[str, Any]:
    described = await coordinator.describe()
    held = {
        m["member_id"]: merged(from_wire(m["owned"]), from_wire(m["assigned"]))
        for m in described["members"]
    }
    for (first, a), (second, b) in combinations(held.items(), 2):
        clashes = overlapping(a, b)
        assert not clashes, f"step {step}: stored holdings of {first} and {second} overlap"
    return described


async def simulate(
    coordinator: Coordinator,
    rng: random.Random,
    assignor: str,
    topics: list[str],
    counts: dict[str, int],
    *,
    steps: int,
    convergence_s: float,
) -> None:
    everyone: list[SimulatedMember] = []

    def live() -> list[SimulatedMember]:
        return [m for m in everyone if not m.crashed and not m.left]

    async def join_one() -> None:
        member = SimulatedMember(
            f"c{len(everyone)}",
            coordinator,
            assignor,
            lazy=rng.random() < 0.5,
            late_start=rng.random() < 0.5,
        )
        everyone.append(member)
        await member.heartbeat(topics)

    for step in range(steps):
        action = rng.random()
        if (action < 0.15 and len(live()) < MAX_MEMBERS) or not live():
            await join_one()
        elif action < 0.20:
            await rng.choice(live()).leave()
        elif action < 0.27:
            rng.choice(live()).crashed = True
        elif action < 0.32:
            topic = rng.choice(topics)
            counts[topic] += rng.randint(1, 2)
            await coordinator.grow_partitions(topic, counts[topic])
        beating = [m for m in live() if rng.random() < 0.85]
        rng.shuffle(beating)
        await asyncio.gather(*(m.heartbeat(topics) for m in beating))
        assert_clients_disjoint(everyone, step)
        await assert_stored_disjoint(coordinator, step)
        if rng.random() < 0.1:
            await coordinator.pause(SESSION_MS / 1000 / 2)

    # Churn stops: the survivors keep heartbeating until the crashed members' sessions
    # expired and were reaped and the group is stable again.
    survivors = live()
    expected = {m.member_id for m in survivors}
    deadline = coordinator.now() + convergence_s
    round_number = 0
    while True:
        for member in survivors:
            await member.heartbeat(topics)
        assert_clients_disjoint(everyone, steps + round_number)
        described = await assert_stored_disjoint(coordinator, steps + round_number)
        members = {m["member_id"] for m in described["members"]}
        if described["state"] == "stable" and members == expected:
            break
        if coordinator.now() > deadline:
            pytest.fail(f"no convergence within {convergence_s} s: {described}")
        round_number += 1
        await coordinator.pause(0.05)
    assert {m["member_id"] for m in described["members"]} == {m.member_id for m in survivors}
    for entry in described["members"]:
        assert entry["owned"] == entry["assigned"] == entry["target"]
    assigned = [s for entry in described["members"] for s in entry["assigned"]]
    assert assigned, "the survivors consume something"


class RouteCoordinator:
    """The real heartbeat route, its database and the wall clock."""

    def __init__(self, api: httpx.AsyncClient, app: FastAPI, group: str) -> None:
        self.api, self.app, self.group = api, app, group

    def now(self) -> float:
        return time.monotonic()

    async def heartbeat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        reply = await self.api.post(f"/v1/groups/{self.group}/heartbeat", json=body)
        return reply.status_code, reply.json()

    async def describe(self) -> dict[str, Any]:
        reply = await self.api.get(f"/v1/admin/groups/{self.group}")
        assert reply.status_code == 200, reply.text
        return dict(reply.json())

    async def grow_partitions(self, topic: str, count: int) -> None:
        """What the metadata refresh writes when Kafka reports more partitions."""
        async with self.app.state.engine.begin() as connection:
            await metadata_repository.write_partition_counts(connection, {topic: count})
            await repository.request_rebalances(connection, [self.group], "partition count changed")

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class InMemoryCoordinator:
    """The route's shell in miniature: it reads the facts the step asks for from
    dictionaries instead of Postgres, stores the outcome back, and keeps time on a clock
    that only moves when the simulation pauses or a heartbeat passes."""

    LIMITS = SessionLimits(default_ms=SESSION_MS, min_ms=1, max_ms=60_000)
    # A heartbeat's round trip on the simulated clock.
    TICK_S = 0.01

    def __init__(self, group: str, counts: dict[str, int], range_fetch: dict[str, bool]) -> None:
        self.group = GroupRecord(group, None, 0, False, None)
        self.counts = counts
        self.range_fetch = range_fetch
        self.members: dict[str, MemberRecord] = {}
        self.expires_at: dict[str, float] = {}
        self.clock = 0.0
        self.member_ids: Callable[[], str] = (f"m-{n}" for n in itertools.count()).__next__

    def now(self) -> float:
        return self.clock

    def _reap(self) -> tuple[str, ...]:
        expired = sorted(mid for mid, at in self.expires_at.items() if at <= self.clock)
        for member_id in expired:
            del self.members[member_id], self.expires_at[member_id]
        return tuple(expired)

    async def heartbeat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.clock += self.TICK_S
        owned = body.get("owned")
        subscribed = body.get("subscribed_topics")
        request = MemberRequest(
            member_id=body.get("member_id"),
            member_epoch=body["member_epoch"],
            subscription=None if subscribed is None else TopicSubscription.of(subscribed, None),
            assignor=body.get("assignor"),
            session_timeout_ms=body.get("session_timeout_ms"),
            owned=None if owned is None else slices_from_wire(owned),
        )
        expired = self._reap()
        member = self.members.get(request.member_id or "")
        facts = HeartbeatFacts(
            group=self.group,
            request=request,
            session_limits=self.LIMITS,
            default_assignor="range",
            expired=expired,
            member=member,
            held_by_others=() if member is None else held_by_others(self.members, member),
            new_member_id=self.member_ids(),
        )
        try:
            outcome = self._decide(facts)
        except KeyrangeError as exc:
            return exc.status, {"error": exc.error}
        self._store(outcome)
        return 200, {
            "member_id": outcome.reply_member_id,
            "member_epoch": outcome.reply_epoch,
            "session_timeout_ms": outcome.reply_session_timeout_ms,
            "assignment": slices_to_wire(outcome.reply_assignment),
        }

    def _decide(self, facts: HeartbeatFacts) -> HeartbeatOutcome:
        for _ in range(3):
            result = heartbeat_step(facts)
            if isinstance(result, HeartbeatOutcome):
                return result
            if isinstance(result, MembersNeeded):
                facts = replace(facts, members=dict(self.members))
            else:
                counts = {
                    t: c
                    for t, c in self.counts.items()
                    if result.topics is None or t in result.topics
                }
                topic_facts = TopicFacts(counts, self.range_fetch, False, True)
                facts = replace(facts, topics=topic_facts)
        raise AssertionError("the step asked for the same facts twice")

    def _store(self, outcome: HeartbeatOutcome) -> None:
        for member_id in outcome.removed:
            self.members.pop(member_id, None)
            self.expires_at.pop(member_id, None)
        for member_id, target in outcome.targets.items():
            self.members[member_id] = replace(self.members[member_id], target=target)
        if outcome.member is not None:
            self.members[outcome.member.member_id] = outcome.member
            self.expires_at[outcome.member.member_id] = (
                self.clock + outcome.member.session_timeout_ms / 1000
            )
        self.group = outcome.group

    async def describe(self) -> dict[str, Any]:
        live = [m for mid, m in self.members.items() if self.expires_at[mid] > self.clock]
        return {
            "state": group_state(self.group, live),
            "members": [
                {
                    "member_id": m.member_id,
                    "owned": slices_to_wire(m.owned),
                    "assigned": slices_to_wire(m.assigned),
                    "target": slices_to_wire(m.target),
                }
                for m in live
            ],
        }

    async def grow_partitions(self, topic: str, count: int) -> None:
        self.counts[topic] = count
        self.group = replace(
            self.group, rebalance_requested=True, rebalance_reason="partition count changed"
        )

    async def pause(self, seconds: float) -> None:
        self.clock += seconds


class UnlockedInMemoryCoordinator(InMemoryCoordinator):
    """The in-memory shell with the route's unlocked heartbeats
    (``coordinator.groups.heartbeat.unlocked_heartbeat``) at their worst: each heartbeat is
    first decided on a snapshot taken up to ``STALE_HEARTBEATS`` heartbeats earlier (a read
    that other heartbeats overtook), without reaping, and stored when the step changes only
    the member's own assignment and neither the member nor the group changed since the
    snapshot; any other heartbeat is decided again on the current state, as under the lock."""

    STALE_HEARTBEATS = 4

    def __init__(self, rng: random.Random, *args: Any) -> None:
        super().__init__(*args)
        self.rng = rng
        self.snapshots: list[tuple[GroupRecord, dict[str, MemberRecord], dict[str, float]]] = []
        self.unlocked = 0

    async def heartbeat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.snapshots = [
            *self.snapshots[-self.STALE_HEARTBEATS :],
            (self.group, dict(self.members), dict(self.expires_at)),
        ]
        if body["member_epoch"] > 0 and "owned" in body:
            answer = self._unlocked(body, *self.rng.choice(self.snapshots))
            if answer is not None:
                self.clock += self.TICK_S
                return 200, answer
        return await super().heartbeat(body)

    def _unlocked(
        self,
        body: dict[str, Any],
        group: GroupRecord,
        members: dict[str, MemberRecord],
        expires_at: dict[str, float],
    ) -> dict[str, Any] | None:
        member = members.get(body["member_id"])
        if member is None or any(at <= self.clock for at in expires_at.values()):
            return None
        facts = HeartbeatFacts(
            group=group,
            request=MemberRequest(
                member_id=body["member_id"],
                member_epoch=body["member_epoch"],
                owned=slices_from_wire(body["owned"]),
            ),
            session_limits=self.LIMITS,
            default_assignor="range",
            member=member,
            held_by_others=held_by_others(members, member),
        )
        outcome = own_row_outcome(facts)
        if outcome is None:
            return None
        if self.members.get(member.member_id) != member or self.group != group:
            return None
        self.unlocked += 1
        self._store(outcome)
        return {
            "member_id": outcome.reply_member_id,
            "member_epoch": outcome.reply_epoch,
            "session_timeout_ms": outcome.reply_session_timeout_ms,
            "assignment": slices_to_wire(outcome.reply_assignment),
        }


ASSIGNORS = ["round-robin", "range", "sticky-join"]


@pytest.mark.parametrize("assignor", ASSIGNORS)
async def test_no_two_live_members_ever_hold_the_same_keys(
    api: httpx.AsyncClient, coordinator_app: FastAPI, assignor: str
) -> None:
    rng = random.Random(f"safety-{assignor}")
    group = f"safety-{assignor}"
    counts = {f"{group}-keyed": 2, f"{group}-whole": 2}
    async with coordinator_app.state.engine.begin() as connection:
        await metadata_repository.write_partition_counts(connection, counts)
    reply = await api.put(
        f"/v1/admin/topics/{group}-keyed/config", json={"accept_range_fetch": True}
    )
    assert reply.status_code == 200
    await simulate(
        RouteCoordinator(api, coordinator_app, group),
        rng,
        assignor,
        sorted(counts),
        counts,
        steps=STEPS,
        convergence_s=CONVERGENCE_S,
    )


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("assignor", ASSIGNORS)
async def test_the_heartbeat_step_alone_never_lets_two_members_hold_the_same_keys(
    assignor: str, seed: int
) -> None:
    """The same simulation against the pure step, longer and over more seeds."""
    rng = random.Random(f"pure-safety-{assignor}-{seed}")
    counts = {"keyed": 2, "whole": 2}
    coordinator = InMemoryCoordinator("g", counts, {"keyed": True})
    await simulate(
        coordinator, rng, assignor, sorted(counts), dict(counts), steps=400, convergence_s=30
    )


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("assignor", ASSIGNORS)
async def test_heartbeats_stored_without_the_lock_from_stale_reads_never_overlap(
    assignor: str, seed: int
) -> None:
    """The simulation with unlocked heartbeats decided on snapshots other heartbeats
    overtook: the guard (member and group unchanged) and the step's own rule (the member
    holds what it held) keep every key in one place, and some heartbeats took that path."""
    rng = random.Random(f"unlocked-safety-{assignor}-{seed}")
    counts = {"keyed": 2, "whole": 2}
    coordinator = UnlockedInMemoryCoordinator(rng, "g", counts, {"keyed": True})
    await simulate(
        coordinator, rng, assignor, sorted(counts), dict(counts), steps=400, convergence_s=30
    )
    assert coordinator.unlocked > 0
