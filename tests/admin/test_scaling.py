"""GET /v1/admin/groups/{group}/scaling on a real coordinator with a live group and a real
broker: the desired-members figure follows the group's lag at its measured rate, is served
to admin tokens only (as KEDA's metrics-api scaler presents one), and is exported as a gauge."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest_asyncio

from tests.client.test_consumer import produce
from tests.fixtures.coordinator import RunningCoordinator
from tests.fixtures.services import MakeTopic
from tests.groups.test_heartbeat_api import Member, given_topics

StartCoordinator = Callable[..., Awaitable[RunningCoordinator]]

ADMIN_TOKEN = "scaling-admin-token-0123456789"
DEADLINE_S = 20.0


@pytest_asyncio.fixture
async def coordinator(
    start_coordinator: StartCoordinator, database_url: str, kafka_bootstrap: str
) -> RunningCoordinator:
    return await start_coordinator(
        database_url,
        kafka_bootstrap=kafka_bootstrap,
        admin_tokens=[ADMIN_TOKEN],
        metrics_group_labels=True,
    )


@pytest_asyncio.fixture
async def api(coordinator: RunningCoordinator) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=coordinator.url, headers=headers) as client:
        yield client


async def owning_member(api: httpx.AsyncClient, group_id: str, topic: str) -> Member:
    member = Member(api, group_id)
    await member.join([topic])
    deadline = time.monotonic() + DEADLINE_S
    while not member.owned:
        assert time.monotonic() < deadline, "the member was never assigned the partition"
        await member.heartbeat()
    return member


async def commit(api: httpx.AsyncClient, member: Member, topic: str, offset: int) -> None:
    reply = await api.post(
        f"/v1/groups/{member.group}/offsets/commit",
        json={
            "member_id": member.member_id,
            "member_epoch": member.epoch,
            "partitions": [{"topic": topic, "partition": 0, "offset": offset}],
        },
    )
    assert reply.status_code == 200, reply.text


async def scaling(api: httpx.AsyncClient, group_id: str, **query: Any) -> dict[str, Any]:
    reply = await api.get(f"/v1/admin/groups/{group_id}/scaling", params=query)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def scaling_once_measured(
    api: httpx.AsyncClient, group_id: str, **query: Any
) -> dict[str, Any]:
    """Polls as KEDA does until the coordinator has two readings far enough apart for a rate."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        figure = await scaling(api, group_id, **query)
        if figure["reason"] != "measuring":
            return figure
        assert time.monotonic() < deadline, f"no rate measured: {figure}"


async def test_the_desired_members_follow_the_lag_past_the_partition_count(
    api: httpx.AsyncClient, kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    group_id = f"scale-{uuid.uuid4().hex[:10]}"
    await produce(kafka_bootstrap, topic, [b"k%d" % i for i in range(200)])
    member = await owning_member(api, group_id, topic)
    query = {"catch_up_seconds": 1, "min_members": 1, "max_members": 500}

    first = await scaling(api, group_id, **query)
    assert (first["reason"], first["members"], first["lag"]) == ("measuring", 1, 200)
    assert first["desired_members"] == 1 and first["processing_rate"] is None

    await commit(api, member, topic, 100)
    measured = await scaling_once_measured(api, group_id, **query)
    assert measured["reason"] == "lag" and measured["lag"] == 100
    assert measured["processing_rate"] > 0

    await produce(kafka_bootstrap, topic, [b"more%d" % i for i in range(3_000)])
    behind = await scaling(api, group_id, **query)
    assert behind["lag"] == 3_100
    # At most 100 records/s were measured (100 in at least a second): one member works off
    # at most 100 of 3 100 in the one-second catch-up time, on a topic of one partition.
    assert behind["desired_members"] >= 31 > measured["desired_members"]

    await commit(api, member, topic, 3_200)
    caught_up = await scaling(api, group_id, **query)
    assert (caught_up["reason"], caught_up["lag"], caught_up["desired_members"]) == (
        "caught-up",
        0,
        1,
    )

    # metrics_group_labels: the per-group series are served without a metrics token.
    async with httpx.AsyncClient(base_url=str(api.base_url)) as scraper:
        exported = (await scraper.get("/metrics")).text
    assert f'keyrange_group_desired_members{{group_id="{group_id}"}} 1.0' in exported


async def test_the_figure_needs_an_admin_token_and_sane_bounds(
    api: httpx.AsyncClient, coordinator: RunningCoordinator, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    group_id = f"scale-{uuid.uuid4().hex[:10]}"
    await owning_member(api, group_id, topic)
    async with httpx.AsyncClient(base_url=coordinator.url) as anonymous:
        refused = await anonymous.get(f"/v1/admin/groups/{group_id}/scaling")
    assert refused.status_code == 401

    inverted = await api.get(
        f"/v1/admin/groups/{group_id}/scaling", params={"min_members": 5, "max_members": 2}
    )
    assert inverted.status_code == 400
    assert "min_members" in inverted.json()["detail"]

    missing = await api.get("/v1/admin/groups/no-such-group/scaling")
    assert missing.status_code == 404


async def test_without_log_ends_the_figure_holds_the_current_members(
    start_coordinator: StartCoordinator, database_url: str
) -> None:
    """No Kafka, no lag: the figure keeps the members there are, where a figure from a lag that
    only looks like zero would scale the workers down to the minimum."""
    offline = await start_coordinator(database_url, admin_tokens=[ADMIN_TOKEN])
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=offline.url, headers=headers) as api:
        group_id = f"scale-{uuid.uuid4().hex[:10]}"
        topic = f"offline-{uuid.uuid4().hex[:8]}"
        await given_topics(offline.app, **{topic: 1})
        members = [await owning_member(api, group_id, topic)]
        members.append(Member(api, group_id))
        await members[1].join([topic])
        await commit(api, members[0], topic, 5)
        figure = await scaling(api, group_id, min_members=1, max_members=10)
    assert (figure["reason"], figure["lag"], figure["members"]) == ("lag-unknown", None, 2)
    assert figure["desired_members"] == 2
