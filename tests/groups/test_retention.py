"""Offset retention (docs/quotas.md): a group with no members and no commits for
``offsets_retention_minutes`` is deleted with its offsets and its metric series, by any
replica, exactly once, and never while someone is using it.

Time is moved by back-dating the stored timestamps: the rule is about what the database
holds, so a test need not wait a retention out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from fastapi import FastAPI
from prometheus_client import generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator import metrics
from coordinator.app import create_app
from coordinator.db.engine import make_engine
from coordinator.groups import loops
from tests.fixtures.coordinator import MakeDatabase, insert_live_member, settings_for_tests

# A day, and timestamps moved two days back: well past it.
SETTINGS = settings_for_tests(offsets_retention_minutes=24 * 60)
LONG_AGO = "now() - interval '2 days'"


@pytest_asyncio.fixture(scope="module")
async def app(make_migrated_database: MakeDatabase) -> AsyncIterator[FastAPI]:
    coordinator = create_app(SETTINGS, await make_migrated_database())
    async with coordinator.router.lifespan_context(coordinator):
        yield coordinator


@pytest_asyncio.fixture(scope="module")
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
        yield client


async def commit(api: httpx.AsyncClient, group: str, **member: object) -> None:
    body = {"partitions": [{"topic": "t", "partition": 0, "offset": 3}], **member}
    reply = await api.post(f"/v1/groups/{group}/offsets/commit", json=body)
    assert reply.status_code == 200, reply.text


async def age(engine: AsyncEngine, *groups: str, commits: bool = True) -> None:
    """Move the groups' creation, last member and (with ``commits``) last commits back."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                f"UPDATE groups SET created_at = {LONG_AGO}, "
                f"members_left_at = CASE WHEN members_left_at IS NULL THEN NULL ELSE {LONG_AGO} "
                "END WHERE group_id = ANY(:groups)"
            ),
            {"groups": list(groups)},
        )
        if commits:
            await connection.execute(
                text(
                    f"UPDATE partition_offsets SET updated_at = {LONG_AGO} "
                    "WHERE group_id = ANY(:groups)"
                ),
                {"groups": list(groups)},
            )


async def stored_groups(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        return {row[0] for row in await connection.execute(text("SELECT group_id FROM groups"))}


async def test_only_groups_idle_for_the_retention_are_deleted(
    app: FastAPI, api: httpx.AsyncClient, database_url_of_app: str
) -> None:
    engine = app.state.engine
    for group in ("idle", "fresh-commit", "live", "just-left"):
        await commit(api, group)
    await insert_live_member(database_url_of_app, "live", "m1")
    await insert_live_member(database_url_of_app, "just-left", "m1")
    await age(engine, "idle", "fresh-commit", "live", "just-left")
    async with engine.begin() as connection:
        # A commit now, and a member leaving now, restart their groups' clocks.
        await connection.execute(
            text("UPDATE partition_offsets SET updated_at = now() WHERE group_id = 'fresh-commit'")
        )
        await connection.execute(text("DELETE FROM members WHERE group_id = 'just-left'"))
    assert await loops.expire_groups_once(engine, SETTINGS) == ["idle"]
    assert {"fresh-commit", "live", "just-left"} <= await stored_groups(engine)
    assert "idle" not in await stored_groups(engine)
    reply = await api.get("/v1/groups/idle/offsets")
    assert reply.json()["partitions"] == []


async def test_an_expired_groups_metric_series_go_with_it(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    joined = await api.post(
        "/v1/groups/metered/heartbeat", json={"member_epoch": 0, "subscribed_topics": ["t"]}
    )
    member = joined.json()
    await api.post(
        "/v1/groups/metered/heartbeat",
        json={"member_id": member["member_id"], "member_epoch": -1},
    )
    metrics.GROUP_MEMBERS.labels("metered").set(1)
    metrics.PARTITION_LAG.labels("metered", "t", "0").set(5)
    assert 'group_id="metered"' in generate_latest(metrics.TENANT_REGISTRY).decode()
    await age(app.state.engine, "metered")
    assert "metered" in await loops.expire_groups_once(app.state.engine, SETTINGS)
    assert 'group_id="metered"' not in generate_latest(metrics.TENANT_REGISTRY).decode()


async def test_a_group_in_use_is_skipped_and_deleted_later(
    app: FastAPI, api: httpx.AsyncClient
) -> None:
    engine = app.state.engine
    await commit(api, "in-use")
    await age(engine, "in-use")
    async with engine.begin() as busy:
        # What a standalone commit holds while it applies.
        await busy.execute(text("SELECT 1 FROM groups WHERE group_id = 'in-use' FOR SHARE"))
        assert "in-use" not in await loops.expire_groups_once(engine, SETTINGS)
    assert "in-use" in await loops.expire_groups_once(engine, SETTINGS)


async def test_replicas_expiring_at_once_delete_each_group_exactly_once(
    app: FastAPI, api: httpx.AsyncClient, database_url_of_app: str
) -> None:
    groups = [f"many-{index:03d}" for index in range(40)]
    for group in groups:
        await commit(api, group)
    await age(app.state.engine, *groups)
    replicas = [make_engine(database_url_of_app, SETTINGS) for _ in range(2)]
    try:
        results = await asyncio.gather(
            *(loops.expire_groups_once(engine, SETTINGS) for engine in replicas)
        )
    finally:
        for engine in replicas:
            await engine.dispose()
    first, second = (set(result) for result in results)
    assert not first & second
    assert first | second >= set(groups)
    assert not set(groups) & await stored_groups(app.state.engine)


@pytest_asyncio.fixture(scope="module")
async def database_url_of_app(app: FastAPI) -> str:
    url: str = app.state.engine.url.render_as_string(hide_password=False)
    return url
