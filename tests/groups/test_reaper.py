"""Several coordinator replicas on one database: a group is reaped by one replica at a time,
every expired member exactly once, and a request that cannot get its group's lock in time is
told to retry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.app import create_app
from coordinator.core.membership import MemberRecord
from coordinator.db.engine import make_engine
from coordinator.groups import loops, repository
from tests.fixtures.coordinator import MakeDatabase, settings_for_tests

SETTINGS = settings_for_tests()


@pytest_asyncio.fixture(scope="module")
async def replicas(make_migrated_database: MakeDatabase) -> AsyncIterator[list[AsyncEngine]]:
    """Two replicas' connection pools on one database."""
    url = await make_migrated_database()
    engines = [make_engine(url, SETTINGS), make_engine(url, SETTINGS)]
    yield engines
    for engine in engines:
        await engine.dispose()


def expiring_member(group_id: str, member_id: str) -> MemberRecord:
    return MemberRecord(
        group_id=group_id,
        member_id=member_id,
        instance_id=None,
        client_id=None,
        client_host=None,
        member_epoch=1,
        previous_member_epoch=1,
        subscribed_topics=("t",),
        subscribed_topic_regex=None,
        assignor=None,
        allow_individual_commit=True,
        # Expired a millisecond after the seeding transaction started.
        session_timeout_ms=1,
    )


async def seed(engine: AsyncEngine, groups: list[str], members_per_group: int) -> None:
    async with engine.begin() as connection:
        for group_id in groups:
            await repository.lock_group(connection, group_id)
            for index in range(members_per_group):
                await repository.insert_member(
                    connection, expiring_member(group_id, f"{group_id}-m{index}")
                )
    await asyncio.sleep(0.01)


async def group_epochs(engine: AsyncEngine, groups: list[str]) -> dict[str, int]:
    async with engine.connect() as connection:
        found = [await repository.find_group(connection, g, lock=False) for g in groups]
    return {group.group_id: group.group_epoch for group in found if group is not None}


async def test_a_group_locked_by_one_replica_is_skipped_by_the_other(
    replicas: list[AsyncEngine],
) -> None:
    first, second = replicas
    groups = ["skip-busy", "skip-free"]
    await seed(first, groups, 2)
    async with first.begin() as busy:
        await repository.lock_group(busy, "skip-busy")
        reaped = await asyncio.wait_for(loops.reap_once(second, SETTINGS), timeout=10)
        assert sorted(reaped) == [("skip-free", "skip-free-m0"), ("skip-free", "skip-free-m1")]
    reaped = await loops.reap_once(second, SETTINGS)
    assert sorted(reaped) == [("skip-busy", "skip-busy-m0"), ("skip-busy", "skip-busy-m1")]


async def test_two_replicas_reaping_at_once_reap_each_member_exactly_once(
    replicas: list[AsyncEngine],
) -> None:
    groups = [f"race-{index:03d}" for index in range(2 * loops.REAP_BATCH + 7)]
    await seed(replicas[0], groups, 2)
    before = await group_epochs(replicas[0], groups)
    reaped_by: list[list[tuple[str, str]]] = [[], []]

    async def replica(index: int) -> None:
        while True:
            reaped = await loops.reap_once(replicas[index], SETTINGS)
            if not reaped:
                return
            reaped_by[index].extend(reaped)

    await asyncio.wait_for(asyncio.gather(replica(0), replica(1)), timeout=60)
    expected = {(g, f"{g}-m{i}") for g in groups for i in range(2)}
    assert set(reaped_by[0]) | set(reaped_by[1]) == expected
    assert not set(reaped_by[0]) & set(reaped_by[1])
    assert len(reaped_by[0]) + len(reaped_by[1]) == len(expected)
    after = await group_epochs(replicas[0], groups)
    assert all(after[g] == before[g] + 1 for g in groups), "each group reassigned once"


async def test_a_heartbeat_that_cannot_get_its_group_in_time_is_told_to_retry(
    make_migrated_database: MakeDatabase,
) -> None:
    url = await make_migrated_database()
    app = create_app(settings_for_tests(db_statement_timeout_ms=300), url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as api:
            async with app.state.engine.begin() as busy:
                await repository.lock_group(busy, "busy-group")
                reply = await api.post(
                    "/v1/groups/busy-group/heartbeat",
                    json={"member_epoch": 0, "subscribed_topics": ["t"]},
                )
            assert reply.status_code == 503, reply.text
            assert reply.json()["error"] == "SERVICE_UNAVAILABLE"
            again = await api.post(
                "/v1/groups/busy-group/heartbeat",
                json={"member_epoch": 0, "subscribed_topics": ["t"]},
            )
            assert again.status_code == 200, again.text
