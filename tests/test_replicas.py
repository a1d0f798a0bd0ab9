"""Several coordinator replicas on one database behave as one coordinator: members heartbeat
and commit through whichever replica they reach, and still no key range is granted twice,
no committed range is lost, and every member that leaves or expires is removed once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator
from tests.fixtures.services import MakeTopic
from tests.waiting import until

Held = dict[str, list[tuple[str, int, int, int]]]


@dataclass
class SimulatedMember:
    name: str
    member_id: str | None = None
    epoch: int = 0
    owned: list[dict[str, Any]] = field(default_factory=list)
    alive: bool = True


def _flatten(slices: list[dict[str, Any]]) -> list[tuple[str, int, int, int]]:
    return [(s["topic"], s["partition"], lo, hi) for s in slices for lo, hi in s["ranges"]]


async def _held_by_members(database_url: str) -> Held:
    """What each member row holds right now: owned and assigned, as the coordinator sees it."""
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(text("SELECT member_id, owned, assigned FROM members"))
            return {row.member_id: _flatten(row.owned) + _flatten(row.assigned) for row in rows}
    finally:
        await engine.dispose()


def _assert_no_double_grant(held: Held) -> None:
    members = sorted(held)
    for i, first in enumerate(members):
        for second in members[i + 1 :]:
            for topic, partition, lo, hi in held[first]:
                for other_topic, other_partition, other_lo, other_hi in held[second]:
                    if (topic, partition) == (other_topic, other_partition):
                        assert hi < other_lo or other_hi < lo, (
                            f"{first} and {second} both hold part of {topic}-{partition}"
                        )


async def test_three_replicas_on_one_database_act_as_one(
    make_migrated_database: MakeDatabase,
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
) -> None:
    database_url = await make_migrated_database()
    replicas = [
        await start_coordinator(database_url, kafka_bootstrap=kafka_bootstrap) for _ in range(3)
    ]
    topic = await make_topic(partitions=2)
    rng = random.Random(11)
    clients = [httpx.AsyncClient(base_url=r.url, timeout=10.0) for r in replicas]
    group = "replicated"
    committed: set[tuple[int, int]] = set()
    try:
        reply = await clients[0].put(
            f"/v1/admin/topics/{topic}/config", json={"accept_range_fetch": True}
        )
        assert reply.status_code == 200
        members = [SimulatedMember(f"w{i}") for i in range(5)]
        next_offset = {0: 0, 1: 0}

        async def heartbeat(member: SimulatedMember) -> None:
            client = rng.choice(clients)
            body: dict[str, Any] = {
                "member_id": member.member_id,
                "member_epoch": member.epoch,
                "session_timeout_ms": 1_000,
                "owned": member.owned,
            }
            if member.member_id is None:
                body["subscribed_topics"] = [topic]
            reply = await client.post(f"/v1/groups/{group}/heartbeat", json=body)
            if reply.status_code == 409:  # fenced or expired: rejoin from scratch
                member.member_id, member.epoch, member.owned = None, 0, []
                return
            assert reply.status_code == 200, reply.text
            answer = reply.json()
            member.member_id, member.epoch = answer["member_id"], answer["member_epoch"]
            # Release revoked ranges at once; the next heartbeat reports the smaller set.
            member.owned = answer["assignment"]

        async def commit(member: SimulatedMember) -> None:
            if member.member_id is None or not member.owned:
                return
            partition = member.owned[0]["partition"]
            start = next_offset[partition]
            next_offset[partition] += rng.randint(1, 5)
            end = next_offset[partition] - 1
            reply = await rng.choice(clients).post(
                f"/v1/groups/{group}/offsets/commit",
                json={
                    "member_id": member.member_id,
                    "member_epoch": member.epoch,
                    "partitions": [
                        {"topic": topic, "partition": partition, "ranges": [[start, end]]}
                    ],
                },
            )
            if reply.status_code == 200 and reply.json()["partitions"][0]["error"] is None:
                committed.update((partition, o) for o in range(start, end + 1))
            else:
                assert reply.status_code == 409, reply.text  # fenced members change nothing
                next_offset[partition] = start

        for step in range(120):
            member = rng.choice(members)
            action = rng.random()
            if not member.alive:
                if action < 0.3:
                    member.alive = True
                    member.member_id, member.epoch, member.owned = None, 0, []
                continue
            if action < 0.05:
                member.alive = False  # crash: stop heartbeating, the session expires
            elif action < 0.1 and member.member_id is not None:
                await rng.choice(clients).post(
                    f"/v1/groups/{group}/heartbeat",
                    json={"member_id": member.member_id, "member_epoch": -1},
                )
                member.member_id, member.epoch, member.owned = None, 0, []
            else:
                await asyncio.gather(*(heartbeat(m) for m in members if m.alive))
                await commit(member)
            _assert_no_double_grant(await _held_by_members(database_url))
            if step % 40 == 39:
                await asyncio.sleep(1.2)  # let crashed sessions expire and replicas reap
                _assert_no_double_grant(await _held_by_members(database_url))

        for member in members:
            member.alive = True

        async def converged() -> bool:  # everyone alive keeps heartbeating
            await asyncio.gather(*(heartbeat(m) for m in members))
            held = await _held_by_members(database_url)
            return len(held) == len(members) and not any(
                _uncovered(held, partition) for partition in (0, 1)
            )

        await until(converged, 30, "the live members to cover both partitions")
        held = await _held_by_members(database_url)
        _assert_no_double_grant(held)
        assert len(held) == len(members)
        for partition in (0, 1):  # the live members together cover each partition exactly
            assert _uncovered(held, partition) is None

        reply = await clients[1].get(f"/v1/groups/{group}/offsets")
        stored = {p["partition"]: p for p in reply.json()["partitions"]}
        for partition, offset in committed:
            state = stored[partition]
            assert offset < state["stable_offset"] or any(
                lo <= offset <= hi for lo, hi in state["ranges"]
            ), f"committed offset {offset} of partition {partition} was lost"
    finally:
        for client in clients:
            await client.aclose()


def _uncovered(held: Held, partition: int) -> str | None:
    """Where the members' pieces of ``partition`` leave a gap in the hash space, if anywhere."""
    pieces = sorted(
        (lo, hi) for ranges in held.values() for _, p, lo, hi in ranges if p == partition
    )
    merged_end = -1
    for lo, hi in pieces:
        if lo > merged_end + 1:
            return f"partition {partition}: nothing holds {merged_end + 1}..{lo - 1}"
        merged_end = max(merged_end, hi)
    if merged_end != 2**63 - 1:
        return f"partition {partition}: nothing holds {merged_end + 1}.."
    return None
