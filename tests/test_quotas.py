"""The per-tenant caps over a real migrated Postgres (docs/quotas.md): members per group,
partitions with stored offsets per group, groups per client-token prefix; and a refused
request creates nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text

from coordinator.app import create_app
from tests.fixtures.coordinator import MakeDatabase, settings_for_tests

ADMIN = {"authorization": "Bearer admin-token-0123456789"}
TEAM_A = {"authorization": "Bearer team-a-token-0123456789"}
TEAM_B = {"authorization": "Bearer team-b-token-0123456789"}
ANYWHERE = {"authorization": "Bearer anywhere-token-0123456789"}
TOKENS: dict[str, Any] = {
    "admin_tokens": ["admin-token-0123456789"],
    "client_tokens": [
        {"token": "team-a-token-0123456789", "group_prefixes": ["team-a.", "team-a.eu."]},
        {"token": "team-b-token-0123456789", "group_prefixes": ["team-b."]},
        {"token": "anywhere-token-0123456789"},
    ],
}


@asynccontextmanager
async def serving(
    make_migrated_database: MakeDatabase, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    app = create_app(settings_for_tests(**settings), await make_migrated_database())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client, app


async def join(api: httpx.AsyncClient, group: str, **extra: Any) -> httpx.Response:
    headers = extra.pop("headers", {})
    body = {"member_epoch": 0, "subscribed_topics": ["t"], **extra}
    return await api.post(f"/v1/groups/{group}/heartbeat", json=body, headers=headers)


async def commit(
    api: httpx.AsyncClient, group: str, *entries: dict[str, Any], headers: Any = None
) -> httpx.Response:
    return await api.post(
        f"/v1/groups/{group}/offsets/commit",
        json={"partitions": list(entries)},
        headers=headers or {},
    )


def offset(partition: int, value: int = 10, topic: str = "t") -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "offset": value}


async def groups(app: FastAPI) -> list[str]:
    async with app.state.engine.connect() as connection:
        rows = await connection.execute(text("SELECT group_id FROM groups ORDER BY group_id"))
        return [row[0] for row in rows]


def refused(reply: httpx.Response, error: str) -> dict[str, Any]:
    assert (reply.status_code, reply.json().get("error")) == (409, error), reply.text
    body: dict[str, Any] = reply.json()
    return body


async def test_a_commit_refused_by_the_switch_creates_no_group(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(make_migrated_database, accept_individual_commit=False) as (api, app):
        reply = await commit(api, "never-made", {"topic": "t", "partition": 0, "ranges": [[1, 2]]})
        refused(reply, "INDIVIDUAL_COMMIT_NOT_ALLOWED")
        assert await groups(app) == []
        # The same group's classic commit is admitted, and creates it.
        assert (await commit(api, "never-made", offset(0))).status_code == 200
        assert await groups(app) == ["never-made"]


async def test_heartbeats_and_leaves_of_unknown_groups_create_nothing(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(make_migrated_database) as (api, app):
        beat = await api.post(
            "/v1/groups/ghost/heartbeat", json={"member_id": "m-x", "member_epoch": 4}
        )
        refused(beat, "UNKNOWN_MEMBER_ID")
        leave = await api.post(
            "/v1/groups/ghost-leave/heartbeat", json={"member_id": "m-x", "member_epoch": -1}
        )
        assert leave.status_code == 200, leave.text
        member_commit = await api.post(
            "/v1/groups/ghost-commit/offsets/commit",
            json={"member_id": "m-x", "member_epoch": 1, "partitions": [offset(0)]},
        )
        refused(member_commit, "UNKNOWN_MEMBER_ID")
        assert await groups(app) == []


async def test_a_full_group_refuses_new_members_but_not_rejoins_or_static_successors(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(make_migrated_database, max_members_per_group=2) as (api, _):
        first = (await join(api, "full")).json()
        second = (await join(api, "full", instance_id="worker-2")).json()
        body = refused(await join(api, "full"), "GROUP_MAX_SIZE_REACHED")
        assert "max_members_per_group = 2" in body["detail"]
        assert body["max_members_per_group"] == 2
        # A member rejoining in place, or a static member's restarted instance, adds nobody.
        rejoined = await join(api, "full", member_id=first["member_id"])
        assert rejoined.status_code == 200, rejoined.text
        successor = await join(api, "full", instance_id="worker-2")
        assert successor.status_code == 200, successor.text
        assert successor.json()["member_id"] != second["member_id"]
        # Once a member leaves, a new one may join.
        leave = await api.post(
            "/v1/groups/full/heartbeat",
            json={"member_id": first["member_id"], "member_epoch": -1},
        )
        assert leave.status_code == 200, leave.text
        assert (await join(api, "full")).status_code == 200


async def test_a_commit_adding_partitions_past_the_cap_is_refused_whole(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(make_migrated_database, max_partitions_per_group=3) as (api, _):
        assert (await commit(api, "wide", offset(0), offset(1))).status_code == 200
        body = refused(
            await commit(api, "wide", offset(0, 50), offset(2), offset(3)),
            "GROUP_MAX_PARTITIONS_REACHED",
        )
        assert "max_partitions_per_group = 3" in body["detail"]
        stored = (await api.get("/v1/groups/wide/offsets")).json()["partitions"]
        assert [(p["partition"], p["stable_offset"]) for p in stored] == [(0, 10), (1, 10)]
        # Partitions it has are always committable; one more fits.
        assert (await commit(api, "wide", offset(0, 60), offset(1, 60))).status_code == 200
        assert (await commit(api, "wide", offset(2, 5))).status_code == 200
        refused(await commit(api, "wide", offset(0, 70, topic="u")), "GROUP_MAX_PARTITIONS_REACHED")


async def test_groups_are_capped_per_token_prefix(make_migrated_database: MakeDatabase) -> None:
    async with serving(make_migrated_database, max_groups_per_prefix=2, **TOKENS) as (api, app):
        assert (await join(api, "team-a.one", headers=TEAM_A)).status_code == 200
        assert (await commit(api, "team-a.two", offset(0), headers=TEAM_A)).status_code == 200
        body = refused(
            await commit(api, "team-a.three", offset(0), headers=TEAM_A), "MAX_GROUPS_REACHED"
        )
        assert "with prefix 'team-a.'" in body["detail"]
        refused(await join(api, "team-a.four", headers=TEAM_A), "MAX_GROUPS_REACHED")
        # The longest matching prefix is the tenant: team-a.eu. has a cap of its own.
        assert (await join(api, "team-a.eu.one", headers=TEAM_A)).status_code == 200
        # Existing groups stay usable, and another tenant is not affected.
        assert (await commit(api, "team-a.two", offset(1), headers=TEAM_A)).status_code == 200
        assert (await commit(api, "team-b.one", offset(0), headers=TEAM_B)).status_code == 200
        # A token without prefixes counts against the whole coordinator (4 groups now).
        refused(await join(api, "misc", headers=ANYWHERE), "MAX_GROUPS_REACHED")
        assert await groups(app) == ["team-a.eu.one", "team-a.one", "team-a.two", "team-b.one"]
        metrics = (await api.get("/metrics")).text
        assert 'keyrange_quota_refusals_total{cap="groups"}' in metrics


async def test_concurrent_creations_never_pass_the_caps(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(
        make_migrated_database, max_groups_per_prefix=3, max_partitions_per_group=4
    ) as (api, app):
        assert (await commit(api, "wide", offset(0))).status_code == 200
        replies = await asyncio.gather(
            *(commit(api, "wide", offset(index, topic="w")) for index in range(12))
        )
        assert sorted(reply.status_code for reply in replies) == [200] * 3 + [409] * 9
        stored = (await api.get("/v1/groups/wide/offsets")).json()["partitions"]
        assert len(stored) == 4
        replies = await asyncio.gather(
            *(commit(api, f"racing-{index}", offset(0)) for index in range(12)),
            *(join(api, f"joining-{index}") for index in range(4)),
        )
        statuses = sorted(reply.status_code for reply in replies)
        assert statuses == [200] * 2 + [409] * 14, [r.text for r in replies]
        assert len(await groups(app)) == 3


async def test_a_commit_of_the_most_partitions_allowed_is_applied_whole(
    make_migrated_database: MakeDatabase,
) -> None:
    """10,000 partitions: the default per-request and per-group limits, and a commit whose
    work is split into turns of the event loop (coordinator/offsets/pacing.py)."""
    async with serving(make_migrated_database) as (api, _):
        entries = [
            {"topic": "big", "partition": p, "ranges": [[p + 100, p + 101]]} for p in range(10_000)
        ]
        for stable in (0, 7):
            if stable:
                entries = [{"topic": "big", "partition": p, "offset": 7} for p in range(10_000)]
            reply = await commit(api, "big", *entries)
            assert reply.status_code == 200, reply.text[:300]
            outcomes = reply.json()["partitions"]
            assert [o["partition"] for o in outcomes] == list(range(10_000))
            assert {o["last_stable_offset"] for o in outcomes} == {stable}
        stored = (await api.get("/v1/groups/big/offsets")).json()["partitions"]
        assert len(stored) == 10_000
        assert {p["stable_offset"] for p in stored} == {7}
        assert stored[9_999]["ranges"] == [[10_099, 10_100]]
