"""The safety invariant (DESIGN §5) under random joins, leaves, crashes and partition growth,
driven through the real heartbeat route: at no point do two live members hold overlapping
key ranges of one partition, and the group converges once the churn stops."""

from __future__ import annotations

import asyncio
import random
import time
from itertools import combinations
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from client.protocol.keyspace import KeyRange, intersect, normalize, subtract
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


class SimulatedMember:
    """A client process. It reports what it owns on its next heartbeat. A lazy one keeps
    revoked slices one heartbeat longer (finishing in-flight work); a late starter starts
    what a reply assigned only after sending its next heartbeat, so that report leaves the
    new slices out although it is about to own them. Without a successful heartbeat for a
    session it drops everything."""

    def __init__(
        self, name: str, api: httpx.AsyncClient, group: str, lazy: bool, late_start: bool
    ) -> None:
        self.name = name
        self.api = api
        self.group = group
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
        if self.crashed or self.left or time.monotonic() >= self.deadline:
            return {}
        return merged(self.owned, self.assignment)

    def _drop_everything(self) -> None:
        self.owned, self.assignment = {}, {}

    async def heartbeat(self, topics: list[str]) -> None:
        if time.monotonic() >= self.deadline:
            self._drop_everything()
        if self.member_id is None or self.epoch == 0:
            body: dict[str, Any] = {
                "member_epoch": 0,
                "member_id": self.member_id,
                "subscribed_topics": topics,
                "session_timeout_ms": SESSION_MS,
                "owned": [],
            }
        else:
            body = {
                "member_id": self.member_id,
                "member_epoch": self.epoch,
                "owned": to_wire(self.owned),
            }
        sent_at = time.monotonic()
        reply = await self.api.post(f"/v1/groups/{self.group}/heartbeat", json=body)
        if reply.status_code == 409:
            error = reply.json()["error"]
            assert error in {"UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"}, reply.text
            self._drop_everything()
            self.epoch = 0
            if error == "UNKNOWN_MEMBER_ID":
                self.member_id = None
            return
        assert reply.status_code == 200, reply.text
        answer = reply.json()
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
            reply = await self.api.post(
                f"/v1/groups/{self.group}/heartbeat",
                json={"member_id": self.member_id, "member_epoch": -1},
            )
            assert reply.status_code == 200, reply.text


def assert_clients_disjoint(members: list[SimulatedMember], step: int) -> None:
    for first, second in combinations(members, 2):
        clashes = overlapping(first.holds(), second.holds())
        assert not clashes, f"step {step}: {first.name} and {second.name} both hold {clashes}"


async def assert_stored_disjoint(api: httpx.AsyncClient, group: str, step: int) -> dict[str, Any]:
    reply = await api.get(f"/v1/admin/groups/{group}")
    assert reply.status_code == 200, reply.text
    described = reply.json()
    held = {
        m["member_id"]: merged(from_wire(m["owned"]), from_wire(m["assigned"]))
        for m in described["members"]
    }
    for (first, a), (second, b) in combinations(held.items(), 2):
        clashes = overlapping(a, b)
        assert not clashes, f"step {step}: stored holdings of {first} and {second} overlap"
    return dict(described)


async def grow_partitions(app: FastAPI, group: str, topic: str, count: int) -> None:
    """What the metadata refresh writes when Kafka reports more partitions."""
    async with app.state.engine.begin() as connection:
        await metadata_repository.write_partition_counts(connection, {topic: count})
        await repository.request_rebalances(connection, [group], "partition count changed")


@pytest.mark.parametrize("assignor", ["round-robin", "range", "sticky-join"])
async def test_no_two_live_members_ever_hold_the_same_keys(
    api: httpx.AsyncClient, coordinator_app: FastAPI, assignor: str
) -> None:
    rng = random.Random(f"safety-{assignor}")
    group = f"safety-{assignor}"
    counts = {f"{group}-keyed": 2, f"{group}-whole": 2}
    topics = sorted(counts)
    async with coordinator_app.state.engine.begin() as connection:
        await metadata_repository.write_partition_counts(connection, counts)
    reply = await api.put(
        f"/v1/admin/topics/{group}-keyed/config", json={"accept_range_fetch": True}
    )
    assert reply.status_code == 200

    everyone: list[SimulatedMember] = []

    def live() -> list[SimulatedMember]:
        return [m for m in everyone if not m.crashed and not m.left]

    async def join_one() -> None:
        member = SimulatedMember(
            f"c{len(everyone)}",
            api,
            group,
            lazy=rng.random() < 0.5,
            late_start=rng.random() < 0.5,
        )
        everyone.append(member)
        await member.heartbeat(topics)

    for step in range(STEPS):
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
            await grow_partitions(coordinator_app, group, topic, counts[topic])
        beating = [m for m in live() if rng.random() < 0.85]
        rng.shuffle(beating)
        await asyncio.gather(*(m.heartbeat(topics) for m in beating))
        assert_clients_disjoint(everyone, step)
        await assert_stored_disjoint(api, group, step)
        if rng.random() < 0.1:
            await asyncio.sleep(SESSION_MS / 1000 / 2)

    # Churn stops: the survivors keep heartbeating until the crashed members' sessions
    # expired and were reaped and the group is stable again.
    survivors = live()
    expected = {m.member_id for m in survivors}
    deadline = time.monotonic() + CONVERGENCE_S
    round_number = 0
    while True:
        for member in survivors:
            await member.heartbeat(topics)
        assert_clients_disjoint(everyone, STEPS + round_number)
        described = await assert_stored_disjoint(api, group, STEPS + round_number)
        members = {m["member_id"] for m in described["members"]}
        if described["state"] == "stable" and members == expected:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"no convergence within {CONVERGENCE_S} s: {described}")
        round_number += 1
        await asyncio.sleep(0.05)
    assert {m["member_id"] for m in described["members"]} == {m.member_id for m in survivors}
    for entry in described["members"]:
        assert entry["owned"] == entry["assigned"] == entry["target"]
    assigned = [s for entry in described["members"] for s in entry["assigned"]]
    assert assigned, "the survivors consume something"
