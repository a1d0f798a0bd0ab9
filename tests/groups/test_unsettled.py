"""Members whose next heartbeat is sure to need the locked path skip the stable renewal
(``MembershipWatch``'s unsettled members, docs/membership.md "Unsettled members"): what the
watch remembers, and a join's hand-off over both of the heartbeat's paths on a real Postgres,
counting the renewal statements the database runs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from coordinator.core.handoff import GroupChange
from coordinator.groups import watch as watch_module
from coordinator.groups.watch import MembershipWatch
from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator
from tests.groups.renewal_statements import count_renewal_statements
from tests.groups.test_direct_heartbeat import WAIT_MS, listening, stable_member, waiting
from tests.groups.test_heartbeat_api import FULL, Member
from tests.waiting import until


async def test_a_change_remembers_the_held_members_it_retargets_but_not_its_author() -> None:
    watch = MembershipWatch()
    for member_id in ("m-moved", "m-author", "m-untouched"):
        watch.hold("orders", member_id)

    watch.deliver(GroupChange("orders", frozenset({"m-moved", "m-author"}), False, by="m-author"))

    assert watch.take_unsettled("orders", "m-moved")
    assert not watch.take_unsettled("orders", "m-moved"), "taken once"
    assert not watch.take_unsettled("orders", "m-author")
    assert not watch.take_unsettled("orders", "m-untouched")


async def test_a_change_for_every_member_or_one_not_held_here_remembers_nobody() -> None:
    watch = MembershipWatch()
    watch.hold("orders", "m-held")

    watch.deliver(GroupChange("orders", None, released=True))
    watch.deliver(GroupChange("orders", frozenset({"m-elsewhere"}), released=False))

    assert not watch.take_unsettled("orders", "m-held")
    assert not watch.take_unsettled("orders", "m-elsewhere")


def test_past_its_limit_the_watch_forgets_the_oldest_member(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watch_module, "UNSETTLED_LIMIT", 2)
    watch = MembershipWatch()
    for member_id in ("m-1", "m-2", "m-1", "m-3"):
        watch.remember_unsettled("orders", member_id)

    assert [watch.take_unsettled("orders", m) for m in ("m-1", "m-2", "m-3")] == [
        True,
        False,
        True,
    ]


@pytest_asyncio.fixture
async def served(make_migrated_database: MakeDatabase) -> AsyncIterator[RunningCoordinator]:
    coordinator = await listening(await make_migrated_database())
    try:
        yield coordinator
    finally:
        await coordinator.stop()


@pytest.mark.parametrize("path", ["protocol", "asgi"])
async def test_a_join_s_hand_off_runs_only_the_renewals_that_can_succeed(
    served: RunningCoordinator, path: str
) -> None:
    """The holder a join retargets, then its release, go straight to the locked path; its
    first heartbeat once settled renews. Before, each of those heartbeats first lost a
    renewal's turn: four renewal statements where two can succeed."""
    engine = served.app.state.engine
    group_id = f"unsettled-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = (
        {"base_url": served.url}
        if path == "protocol"
        else {"transport": httpx.ASGITransport(app=served.app), "base_url": "http://coordinator"}
    )
    async with httpx.AsyncClient(timeout=60, **options) as api:
        holder = await stable_member(served, api, group_id, "unsettled_flow")
        renewals = count_renewal_statements(engine)
        # Every connection from here on is a new one, which reports its statements.
        await engine.dispose()

        before = waiting()
        held = asyncio.create_task(holder.heartbeat(wait_ms=WAIT_MS))
        await until(lambda: waiting() > before or held.done(), 10, "the heartbeat to be held")
        await Member(api, group_id).join(["unsettled_flow"])
        woken = await asyncio.wait_for(held, WAIT_MS / 1000 + 10)
        revoked = await holder.heartbeat()
        settled = await holder.heartbeat()
        renewed = await holder.heartbeat()

    assert woken["heartbeat_now"] is True
    assert woken["assignment"][0]["ranges"] == [FULL]
    assert revoked["assignment"][0]["ranges"][0] != FULL
    assert settled["assignment"] == revoked["assignment"] == renewed["assignment"]
    assert renewals() == 2  # the held heartbeat's and the last one's
