"""Prompt hand-offs over the real route and Postgres: a heartbeat that offers to wait is held
until something changes for its member, on this replica or another, and only a reply that
tells the member nothing new is ever held (docs/membership.md, "Prompt hand-offs").

The coordinators here tell members a 20 s heartbeat interval, so every reply that arrives
well before that was answered by a change, not by the interval running out.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest_asyncio
from fastapi import FastAPI
from prometheus_client import REGISTRY
from sqlalchemy import text

from coordinator.app import create_app
from tests.fixtures.coordinator import RunningCoordinator, settings_for_tests
from tests.groups.test_heartbeat_api import FULL, Member, given_topics, set_range_fetch
from tests.waiting import until

LONG_INTERVAL = {"heartbeat_interval_ms": 20_000, "session_timeout_default_ms": 60_000}
WAIT_MS = 20_000
# Far below the 20 s interval, far above what a change takes to arrive on a busy machine.
PROMPTLY_S = 10.0


@pytest_asyncio.fixture(scope="module")
async def slow_app(database_url: str) -> AsyncIterator[FastAPI]:
    app = create_app(settings_for_tests(**LONG_INTERVAL), database_url)
    async with app.router.lifespan_context(app):
        await until(lambda: app.state.membership_watch.listening, 10, "the watch to listen")
        yield app


@pytest_asyncio.fixture(scope="module")
async def slow_api(slow_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=slow_app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://coordinator", timeout=60
    ) as client:
        yield client


def group() -> str:
    return f"handoff-{uuid.uuid4().hex[:8]}"


def waiting() -> float:
    return REGISTRY.get_sample_value("keyrange_heartbeats_waiting") or 0.0


async def held_heartbeat(member: Member) -> asyncio.Task[dict[str, Any]]:
    """Send a heartbeat that offers to wait, and return once the coordinator holds it."""
    before = waiting()
    task = asyncio.create_task(member.heartbeat(wait_ms=WAIT_MS))
    await until(lambda: waiting() > before or task.done(), 10, "the heartbeat to be held")
    assert not task.done(), f"answered at once: {task.result()}"
    return task


async def answer_of(task: asyncio.Task[dict[str, Any]]) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    reply = await asyncio.wait_for(task, WAIT_MS / 1000 + 10)
    return reply, time.monotonic() - started


async def stable_member(api: httpx.AsyncClient, group_id: str, topic: str) -> Member:
    member = Member(api, group_id)
    await member.join([topic])
    await member.heartbeat()  # reports what it was given: stable
    assert member.owned == [{"topic": topic, "partition": 0, "ranges": [FULL]}]
    return member


async def test_a_waiting_holder_hears_at_once_that_a_joiner_takes_half_its_partition(
    slow_app: FastAPI, slow_api: httpx.AsyncClient
) -> None:
    await given_topics(slow_app, shared_flow=1)
    await set_range_fetch(slow_api, "shared_flow", True)
    group_id = group()
    holder = await stable_member(slow_api, group_id, "shared_flow")
    held = await held_heartbeat(holder)

    await Member(slow_api, group_id).join(["shared_flow"])
    reply, took = await answer_of(held)

    assert reply["heartbeat_now"] is True
    assert took < PROMPTLY_S
    revoked = await holder.heartbeat(wait_ms=WAIT_MS)  # answered at once: it must release
    assert len(revoked["assignment"][0]["ranges"]) == 1
    assert revoked["assignment"][0]["ranges"][0] != FULL


async def test_a_waiting_heir_hears_at_once_that_its_share_was_released(
    slow_app: FastAPI, slow_api: httpx.AsyncClient
) -> None:
    await given_topics(slow_app, heir_flow=1)
    await set_range_fetch(slow_api, "heir_flow", True)
    group_id = group()
    holder = await stable_member(slow_api, group_id, "heir_flow")
    heir = Member(slow_api, group_id)
    await heir.join(["heir_flow"])
    assert heir.owned == []  # the holder has not let go yet
    await holder.heartbeat()  # hears of the revocation
    held = await held_heartbeat(heir)

    await holder.heartbeat()  # reports the half it gave up
    reply, took = await answer_of(held)

    assert reply["heartbeat_now"] is True
    assert took < PROMPTLY_S
    granted = await heir.heartbeat()
    assert granted["assignment"] and granted["member_epoch"] > reply["member_epoch"]


async def test_a_reply_with_news_is_never_held(
    slow_app: FastAPI, slow_api: httpx.AsyncClient
) -> None:
    await given_topics(slow_app, news_flow=1)
    await set_range_fetch(slow_api, "news_flow", True)
    group_id = group()
    holder = await stable_member(slow_api, group_id, "news_flow")
    await Member(slow_api, group_id).join(["news_flow"])

    started = time.monotonic()
    revoked = await holder.heartbeat(wait_ms=WAIT_MS)

    assert time.monotonic() - started < PROMPTLY_S
    assert revoked["heartbeat_now"] is False
    assert revoked["assignment"][0]["ranges"][0] != FULL


async def test_a_change_on_another_replica_answers_a_heartbeat_held_here(
    make_migrated_database: Callable[[], Awaitable[str]],
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
) -> None:
    database_url = await make_migrated_database()
    here, there = [await start_coordinator(database_url, **LONG_INTERVAL) for _ in range(2)]
    for replica in (here, there):
        await until(
            lambda replica=replica: replica.app.state.membership_watch.listening,
            10,
            "the replica's watch to listen",
        )
    await given_topics(here.app, spread=1)
    async with (
        httpx.AsyncClient(base_url=here.url, timeout=60) as near,
        httpx.AsyncClient(base_url=there.url, timeout=60) as far,
    ):
        await set_range_fetch(near, "spread", True)
        group_id = group()
        holder = await stable_member(near, group_id, "spread")
        held = await held_heartbeat(holder)

        await Member(far, group_id).join(["spread"])
        reply, took = await answer_of(held)

    assert reply["heartbeat_now"] is True
    assert took < PROMPTLY_S


async def test_a_held_reply_counts_its_wait_from_the_request_s_arrival(
    slow_app: FastAPI, slow_api: httpx.AsyncClient
) -> None:
    """Serving the heartbeat is part of the wait the member offered, not added to it: a
    heartbeat kept 4 s from its member's row (its renewal takes the locked path, which
    waits for the row) and offering to wait 4 s is answered at about 4 s, not 8."""
    await given_topics(slow_app, late_flow=1)
    group_id = group()
    member = await stable_member(slow_api, group_id, "late_flow")
    locked_s, wait_ms = 4.0, 4_000
    lock_member = text("SELECT 1 FROM members WHERE group_id = :g AND member_id = :m FOR UPDATE")
    async with slow_app.state.engine.begin() as connection:
        await connection.execute(lock_member, {"g": group_id, "m": member.member_id})
        started = time.monotonic()
        task = asyncio.create_task(member.heartbeat(wait_ms=wait_ms))
        await asyncio.sleep(locked_s)
    reply = await asyncio.wait_for(task, WAIT_MS / 1000)
    took = time.monotonic() - started

    assert reply["heartbeat_now"] is True
    assert wait_ms / 1000 - 0.05 <= took < locked_s + wait_ms / 1000 - 1.5


async def test_with_prompt_handoff_off_a_heartbeat_is_answered_at_once(
    database_url: str,
) -> None:
    app = create_app(settings_for_tests(**LONG_INTERVAL, prompt_handoff=False), database_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://coordinator", timeout=60
        ) as api,
    ):
        await given_topics(app, quiet_flow=1)
        member = await stable_member(api, group(), "quiet_flow")
        started = time.monotonic()
        reply = await member.heartbeat(wait_ms=WAIT_MS)

    assert time.monotonic() - started < PROMPTLY_S
    assert reply["heartbeat_now"] is False
    assert not app.state.membership_watch.listening
