"""Partition counts and lag from a real (embedded) Kafka broker: learned before a join's
transaction, refreshed into the database, and driving rebalances."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI

from coordinator.app import create_app
from coordinator.groups import loops, metadata_repository
from tests.fixtures.coordinator import MakeDatabase, settings_for_tests
from tests.fixtures.services import MakeTopic
from tests.groups.test_locked_statements import statements_where


@pytest_asyncio.fixture(scope="module")
async def kafka_app(
    make_migrated_database: MakeDatabase, kafka_bootstrap: str
) -> AsyncIterator[FastAPI]:
    url = await make_migrated_database()
    # The refresh runs when a test says so (``refresh``), not on a timer racing the test.
    settings = settings_for_tests(kafka_bootstrap=kafka_bootstrap, metadata_refresh_ms=600_000)
    app = create_app(settings, url)
    async with app.router.lifespan_context(app):
        yield app


@pytest_asyncio.fixture(scope="module")
async def kafka_api(kafka_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=kafka_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as client:
        yield client


async def refresh(app: FastAPI) -> dict[str, int | None]:
    """One pass of the metadata refresh loop."""
    return await loops.refresh_metadata_once(
        app.state.engine, app.state.cluster, app.state.stored_topics
    )


async def join(api: httpx.AsyncClient, group: str, **subscription: Any) -> dict[str, Any]:
    reply = await api.post(
        f"/v1/groups/{group}/heartbeat", json={"member_epoch": 0, **subscription}
    )
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def test_a_join_learns_partition_counts_of_new_topics_from_kafka(
    kafka_api: httpx.AsyncClient, make_topic: MakeTopic
) -> None:
    topic = await make_topic(3)
    body = await join(kafka_api, "meta-join", subscribed_topics=[topic])
    assert sorted(s["partition"] for s in body["assignment"]) == [0, 1, 2]


async def test_topics_that_do_not_exist_are_not_created_and_assign_nothing(
    kafka_api: httpx.AsyncClient, kafka_app: FastAPI
) -> None:
    body = await join(kafka_api, "meta-missing", subscribed_topics=["meta-no-such-topic"])
    assert body["assignment"] == []
    assert "meta-no-such-topic" not in await kafka_app.state.cluster.list_topics()


async def test_regex_subscription_picks_up_a_topic_created_later(
    kafka_api: httpx.AsyncClient, kafka_app: FastAPI, make_topic: MakeTopic
) -> None:
    first = await make_topic(1)
    prefix = first.rsplit("-", 1)[0]
    body = await join(kafka_api, "meta-regex", subscribed_topic_regex=rf"{prefix}-[0-9a-f]+")
    assert [s["topic"] for s in body["assignment"]] == [first]
    second = await make_topic(2)
    assert second.startswith(prefix)
    assert (await refresh(kafka_app)) == {second: 2}
    member = {"member_id": body["member_id"], "member_epoch": body["member_epoch"]}
    owned = body["assignment"]
    for _ in range(5):
        reply = await kafka_api.post(
            "/v1/groups/meta-regex/heartbeat", json={**member, "owned": owned}
        )
        assert reply.status_code == 200, reply.text
        member["member_epoch"] = reply.json()["member_epoch"]
        owned = reply.json()["assignment"]
        if {s["topic"] for s in owned} == {first, second}:
            return
    raise AssertionError(f"the refresh never assigned {second}: {owned}")


async def test_refresh_corrects_stale_counts_and_rebalances_the_group(
    kafka_api: httpx.AsyncClient, kafka_app: FastAPI, make_topic: MakeTopic
) -> None:
    topic = await make_topic(4)
    body = await join(kafka_api, "meta-refresh", subscribed_topics=[topic])
    member = {"member_id": body["member_id"], "member_epoch": body["member_epoch"]}
    owned: list[dict[str, Any]] = body["assignment"]

    async def heartbeat() -> set[int]:
        nonlocal owned
        reply = await kafka_api.post(
            "/v1/groups/meta-refresh/heartbeat", json={**member, "owned": owned}
        )
        assert reply.status_code == 200, reply.text
        member["member_epoch"] = reply.json()["member_epoch"]
        owned = reply.json()["assignment"]
        return {s["partition"] for s in owned}

    # As if Kafka had reported one partition until now: the group is assigned just that.
    async with kafka_app.state.engine.begin() as connection:
        await metadata_repository.write_partition_counts(connection, {topic: 1})
    assert (await kafka_api.post("/v1/admin/groups/meta-refresh/rebalance")).status_code == 200
    assert await heartbeat() == {0}
    assert await heartbeat() == {0}
    assert (await refresh(kafka_app)) == {topic: 4}
    assert await heartbeat() == {0, 1, 2, 3}


async def test_describe_shows_lag_against_the_high_watermark(
    kafka_api: httpx.AsyncClient, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        for index in range(10):
            await producer.send_and_wait(topic, b"v", key=f"k{index}".encode(), partition=0)
    finally:
        await producer.stop()
    body = await join(kafka_api, "meta-lag", subscribed_topics=[topic])
    commit = await kafka_api.post(
        "/v1/groups/meta-lag/offsets/commit",
        json={
            "member_id": body["member_id"],
            "member_epoch": body["member_epoch"],
            "partitions": [
                {"topic": topic, "partition": 0, "ranges": [[0, 3], [6, 7]]},
            ],
        },
    )
    assert commit.status_code == 200, commit.text
    described = (await kafka_api.get("/v1/admin/groups/meta-lag")).json()
    [partition] = described["partitions"]
    assert (partition["stable_offset"], partition["high_watermark"]) == (4, 10)
    # The two offsets committed individually above the stable offset are not lag.
    assert (partition["lag"], partition["ic_offsets"]) == (4, 2)
    assert described["members"][0]["member_id"] == body["member_id"]


async def test_a_join_into_topics_seen_stored_reads_their_facts_once_under_the_lock(
    kafka_api: httpx.AsyncClient, kafka_app: FastAPI, make_topic: MakeTopic
) -> None:
    """Every join sends its subscription: once a topic's count is stored, a join reads the
    topic's facts only inside its transaction, in one statement, and nothing before it
    (docs/membership.md, "Subscriptions"): each round trip here is on a join's hand-off."""
    topic = await make_topic(2)
    await join(kafka_api, "meta-seen", subscribed_topics=[topic])
    taken = statements_where(
        kafka_app.state.engine, lambda text, _: any(table in text for table in _TOPIC_TABLES)
    )

    body = await join(kafka_api, "meta-seen-again", subscribed_topics=[topic])
    topic_reads = [" ".join(text.split()[:3]) for text in taken()]

    assert sorted(s["partition"] for s in body["assignment"]) == [0, 1]
    assert topic_reads == ["WITH counted AS"]


async def test_the_refresh_notes_every_stored_count_and_forgets_the_topics_it_removes(
    kafka_api: httpx.AsyncClient, kafka_app: FastAPI, make_topic: MakeTopic
) -> None:
    """So that a join into a topic some other replica stored skips the learning read too, and
    one into a topic the refresh removed reads again."""
    stored = kafka_app.state.stored_topics
    topic = await make_topic(1)
    gone = f"meta-gone-{uuid.uuid4().hex[:8]}"
    async with kafka_app.state.engine.begin() as connection:
        await metadata_repository.write_partition_counts(connection, {topic: 1, gone: 1})
    await join(kafka_api, "meta-gone", subscribed_topics=[gone])
    assert stored.all_stored({gone}) and not stored.all_stored({topic})

    assert (await refresh(kafka_app)) == {gone: None}
    assert stored.all_stored({topic}) and not stored.all_stored({gone})


_TOPIC_TABLES = ("topic_metadata", "topic_config", "coordinator_config")
