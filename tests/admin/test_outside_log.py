"""Stored offsets against the log they describe, through the admin API and CLI and the
readers' out-of-range reset: past the log end is flagged with its lag, an admin reset there
(or to a partition the topic lacks) is refused unless forced, and a reader's reset moves only
a state that is past the end, fenced like a commit."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import pytest_asyncio

from tests.admin.test_cli import run_cli
from tests.client.test_consumer import produce
from tests.fixtures.coordinator import RunningCoordinator, insert_live_member
from tests.fixtures.services import MakeTopic

StartCoordinator = Callable[..., Awaitable[RunningCoordinator]]

RECORDS = 30


@pytest_asyncio.fixture
async def coordinator(
    start_coordinator: StartCoordinator, database_url: str, kafka_bootstrap: str
) -> RunningCoordinator:
    return await start_coordinator(database_url, kafka_bootstrap=kafka_bootstrap)


@pytest_asyncio.fixture
async def api(coordinator: RunningCoordinator) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=coordinator.url) as client:
        yield client


@pytest_asyncio.fixture
async def topic(kafka_bootstrap: str, make_topic: MakeTopic) -> str:
    name = await make_topic(1)
    await produce(kafka_bootstrap, name, [b"k%d" % i for i in range(RECORDS)])
    return name


def group() -> str:
    return f"oor-{uuid.uuid4().hex[:10]}"


async def _commit(api: httpx.AsyncClient, group_id: str, topic: str, offset: int) -> None:
    reply = await api.post(
        f"/v1/groups/{group_id}/offsets/commit",
        json={"partitions": [{"topic": topic, "partition": 0, "offset": offset}]},
    )
    assert reply.status_code == 200, reply.text


async def _partition(api: httpx.AsyncClient, group_id: str) -> dict[str, object]:
    reply = await api.get(f"/v1/admin/groups/{group_id}/offsets")
    assert reply.status_code == 200, reply.text
    partitions: list[dict[str, object]] = reply.json()["partitions"]
    return partitions[0]


async def test_offsets_past_the_log_end_are_flagged_with_lag(
    api: httpx.AsyncClient, topic: str
) -> None:
    behind, past = group(), group()
    await _commit(api, behind, topic, 10)
    await _commit(api, past, topic, 2_000)
    normal = await _partition(api, behind)
    assert (normal["offset_out_of_range"], normal["lag"]) == (False, RECORDS - 10)
    flagged = await _partition(api, past)
    assert (flagged["offset_out_of_range"], flagged["high_watermark"]) == (True, RECORDS)
    assert flagged["lag"] == RECORDS


async def test_a_reset_past_the_log_end_is_refused_unless_forced(
    api: httpx.AsyncClient, topic: str
) -> None:
    group_id = group()
    await _commit(api, group_id, topic, 5)
    path = f"/v1/admin/groups/{group_id}/offsets/reset"
    refused = await api.post(path, json={"topic": topic, "to_offset": RECORDS + 1})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "OFFSET_OUT_OF_RANGE"
    assert f"ends at {RECORDS}" in refused.json()["detail"]
    assert (await _partition(api, group_id))["stable_offset"] == 5
    at_the_end = await api.post(path, json={"topic": topic, "to_offset": RECORDS})
    assert at_the_end.status_code == 200, at_the_end.text
    forced = await api.post(path, json={"topic": topic, "to_offset": 2_000, "force": True})
    assert forced.status_code == 200, forced.text
    assert (await _partition(api, group_id))["stable_offset"] == 2_000


async def test_a_reset_of_a_partition_the_topic_lacks_is_refused_unless_forced(
    api: httpx.AsyncClient, topic: str
) -> None:
    group_id = group()
    path = f"/v1/admin/groups/{group_id}/offsets/reset"
    await _commit(api, group_id, topic, 5)
    for body in (
        {"topic": topic, "partitions": [3], "to_offset": 0},
        {"topic": f"{topic}-missing", "partitions": [0], "to_offset": 0},
    ):
        refused = await api.post(path, json=body)
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"] == "UNKNOWN_TOPIC_OR_PARTITION"
    forced = await api.post(
        path, json={"topic": topic, "partitions": [3], "to_offset": 0, "force": True}
    )
    assert forced.status_code == 200, forced.text


async def test_the_cli_warns_of_offsets_past_the_end_and_needs_force_to_set_one(
    coordinator: RunningCoordinator,
    api: httpx.AsyncClient,
    topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    group_id = group()
    await _commit(api, group_id, topic, 2_000)
    assert await run_cli("admin", "--url", coordinator.url, "offsets", group_id) == 0
    warning = capsys.readouterr().err
    assert f"{topic}[0]: stored offset 2000 is past the log end {RECORDS}" in warning
    reset = ("admin", "--url", coordinator.url, "reset", group_id, "--topic", topic)
    assert await run_cli(*reset, "--to-offset", "500") == 1
    assert "answered OFFSET_OUT_OF_RANGE: offset 500 is past the log end" in capsys.readouterr().err
    assert await run_cli(*reset, "--to-offset", "500", "--force", "--execute") == 0


async def test_a_readers_reset_moves_only_a_state_past_the_end_and_is_fenced(
    api: httpx.AsyncClient, topic: str, database_url: str
) -> None:
    inside, past = group(), group()
    await _commit(api, inside, topic, 10)
    await _commit(api, past, topic, 2_000)

    async def reset(group_id: str, offset: int) -> httpx.Response:
        return await api.post(
            f"/v1/groups/{group_id}/offsets/out-of-range-reset",
            json={"partitions": [{"topic": topic, "partition": 0, "offset": offset}]},
        )

    untouched = await reset(inside, 0)
    assert untouched.status_code == 200, untouched.text
    assert untouched.json()["partitions"][0]["stable_offset"] == 10
    beyond = await reset(past, RECORDS + 1)
    assert (beyond.status_code, beyond.json()["error"]) == (409, "OFFSET_OUT_OF_RANGE")
    await insert_live_member(database_url, past, "m-1")
    fenced = await reset(past, 0)
    assert (fenced.status_code, fenced.json()["error"]) == (409, "UNKNOWN_MEMBER_ID")
    assert (await _partition(api, past))["stable_offset"] == 2_000
