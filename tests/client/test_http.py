"""CoordinatorClient against the real coordinator app (in-process ASGI), plus a tiny ASGI stub
that only exercises transport-level behaviour: retries, backoff limits and error mapping."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from aiokafka.structs import TopicPartition
from fastapi import FastAPI

from client import errors
from client.http import (
    CoordinatorClient,
    HeartbeatRequest,
    KeyOwner,
    PartitionCommit,
    StuckCall,
)
from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import KeyRange
from coordinator.app import create_app
from tests.fixtures.coordinator import free_port, settings_for_tests
from tests.groups.test_heartbeat_api import given_topics

HALF = KeyRange.full().split(2)[0]


def group() -> str:
    return f"http-{uuid.uuid4().hex[:10]}"


@pytest_asyncio.fixture
async def coordinator(coordinator_app: FastAPI) -> AsyncIterator[CoordinatorClient]:
    transport = httpx.ASGITransport(app=coordinator_app)
    async with CoordinatorClient("http://coordinator", transport=transport) as client:
        yield client


async def test_commit_and_fetch_round_trip_ranges_watermarks_and_metadata(
    coordinator: CoordinatorClient,
) -> None:
    group_id = group()
    replies = await coordinator.commit(
        group_id,
        [
            PartitionCommit(
                "orders",
                0,
                ranges=[(0, 4), (8, 9)],
                watermarks=[Watermark(HALF, 20)],
                metadata="m",
            ),
            PartitionCommit("orders", 1, offset=7),
        ],
    )
    assert [(r.topic_partition, r.error, r.last_stable_offset) for r in replies] == [
        (TopicPartition("orders", 0), None, 5),
        (TopicPartition("orders", 1), None, 7),
    ]
    fetched = await coordinator.fetch_offsets(group_id)
    assert fetched == {
        TopicPartition("orders", 0): CommittedOffsets(
            stable_offset=5, ranges=((8, 9),), watermarks=(Watermark(HALF, 20),), metadata="m"
        ),
        TopicPartition("orders", 1): CommittedOffsets(stable_offset=7),
    }
    only = await coordinator.fetch_offsets(group_id, ["orders"], partitions=[1])
    assert list(only) == [TopicPartition("orders", 1)]


async def test_a_commit_wholly_below_the_stable_offset_is_too_old_and_reports_it(
    coordinator: CoordinatorClient,
) -> None:
    group_id = group()
    await coordinator.commit(group_id, [PartitionCommit("orders", 0, offset=10)])
    [reply] = await coordinator.commit(group_id, [PartitionCommit("orders", 0, ranges=[(2, 3)])])
    assert (reply.error, reply.last_stable_offset) == ("INDIVIDUAL_COMMIT_TOO_OLD", 10)


async def test_an_unknown_group_has_no_offsets(coordinator: CoordinatorClient) -> None:
    assert await coordinator.fetch_offsets(group()) == {}


async def test_malformed_input_raises_invalid_request_and_is_not_retriable(
    coordinator: CoordinatorClient,
) -> None:
    with pytest.raises(errors.InvalidRequest) as caught:
        await coordinator.commit(group(), [PartitionCommit("orders", 0, ranges=[(5, 3)])])
    assert caught.value.status == 400
    assert not caught.value.retriable


async def test_a_bad_group_id_never_reaches_the_wire() -> None:
    calls: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        return httpx.Response(200, json={"partitions": []})

    async with CoordinatorClient("http://c", transport=httpx.MockTransport(record)) as client:
        for bad in ("..", "a/b", "", "x" * 256):
            with pytest.raises(errors.InvalidRequest):
                await client.fetch_offsets(bad)
    assert calls == []


async def test_tokens_map_to_unauthorized_and_forbidden(database_url: str) -> None:
    settings = settings_for_tests(
        client_tokens=[{"token": "team-token", "group_prefixes": ["team-"]}]
    )
    app = create_app(settings, database_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with CoordinatorClient("http://c", transport=transport) as anonymous:
            with pytest.raises(errors.Unauthorized):
                await anonymous.fetch_offsets("team-a")
        async with CoordinatorClient("http://c", token="team-token", transport=transport) as c:
            with pytest.raises(errors.Forbidden):
                await c.fetch_offsets("other-a")
            assert await c.fetch_offsets("team-a") == {}


class Stub:
    """Answers each call with the next scripted (status, body); records what it got."""

    def __init__(self, *script: tuple[int, dict[str, Any]]) -> None:
        self.script = list(script)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, body = self.script.pop(0)
        return httpx.Response(
            status, content=json.dumps(body), headers={"content-type": "application/problem+json"}
        )


def problem(status: int, name: str) -> tuple[int, dict[str, Any]]:
    return status, {"type": "about:blank", "title": name, "status": status, "error": name}


HEARTBEAT_REPLY = {
    "member_id": "m-1",
    "member_epoch": 3,
    "heartbeat_interval_ms": 300,
    "session_timeout_ms": 3000,
    "assignment": [{"topic": "t", "partition": 0, "ranges": [[0, 9]]}],
}


async def test_server_errors_are_retried_then_succeed_with_the_bearer_token() -> None:
    stub = Stub(problem(503, "SERVICE_UNAVAILABLE"), (502, {}), (200, {"partitions": []}))
    async with CoordinatorClient("http://c", token="t0k", transport=httpx.MockTransport(stub)) as c:
        assert await c.commit("g", [PartitionCommit("t", 0, offset=1)]) == []
    assert len(stub.requests) == 3
    assert {r.headers["authorization"] for r in stub.requests} == {"Bearer t0k"}


async def test_retries_are_bounded_and_end_in_a_retriable_error() -> None:
    stub = Stub(*[problem(503, "SERVICE_UNAVAILABLE")] * 3)
    transport = httpx.MockTransport(stub)
    async with CoordinatorClient("http://c", max_retries=2, transport=transport) as c:
        with pytest.raises(errors.CoordinatorUnavailable) as caught:
            await c.fetch_offsets("g")
    assert caught.value.retriable
    assert len(stub.requests) == 3


@pytest.mark.parametrize(
    ("status", "name", "expected"),
    [
        (409, "FENCED_MEMBER_EPOCH", errors.FencedMemberEpoch),
        (409, "UNKNOWN_MEMBER_ID", errors.UnknownMemberId),
        (409, "INDIVIDUAL_COMMIT_NOT_ALLOWED", errors.IndividualCommitNotAllowed),
        (409, "GROUP_NOT_EMPTY", errors.GroupNotEmpty),
        (404, "GROUP_ID_NOT_FOUND", errors.GroupIdNotFound),
        (418, "SOMETHING_NEW", errors.KeyrangeClientError),
    ],
)
async def test_problem_documents_raise_their_named_error_without_retry(
    status: int, name: str, expected: type[errors.KeyrangeClientError]
) -> None:
    stub = Stub(problem(status, name))
    async with CoordinatorClient("http://c", transport=httpx.MockTransport(stub)) as c:
        with pytest.raises(expected) as caught:
            await c.commit("g", [], member_id="m", member_epoch=1)
    assert type(caught.value) is expected
    assert not caught.value.retriable
    assert len(stub.requests) == 1


async def test_an_anonymous_join_is_sent_once_but_a_heartbeat_is_retried() -> None:
    stub = Stub(problem(503, "SERVICE_UNAVAILABLE"))
    async with CoordinatorClient("http://c", transport=httpx.MockTransport(stub)) as c:
        with pytest.raises(errors.CoordinatorUnavailable):
            await c.heartbeat("g", HeartbeatRequest(member_epoch=0, subscribed_topics=["t"]))
    assert len(stub.requests) == 1

    stub = Stub(problem(503, "SERVICE_UNAVAILABLE"), (200, HEARTBEAT_REPLY))
    async with CoordinatorClient("http://c", transport=httpx.MockTransport(stub)) as c:
        reply = await c.heartbeat(
            "g",
            HeartbeatRequest(
                member_epoch=3,
                member_id="m-1",
                owned={TopicPartition("t", 0): [KeyRange(0, 9)]},
            ),
        )
    assert reply.assignment == {TopicPartition("t", 0): [KeyRange(0, 9)]}
    sent = json.loads(stub.requests[-1].content)
    assert sent["owned"] == [{"topic": "t", "partition": 0, "ranges": [[0, 9]]}]


def test_stuck_calls_are_sent_only_when_reported() -> None:
    """None (nothing new to say) sends no field, so a coordinator older than stuck calls
    never sees one from a member with nothing stuck; an empty report clears."""
    plain = HeartbeatRequest(member_epoch=3, member_id="m-1")
    assert "stuck" not in plain.to_json()
    assert HeartbeatRequest(member_epoch=3, member_id="m-1", stuck=()).to_json()["stuck"] == []
    call = StuckCall("orders", 2, 2**63 - 1, 41, 12.5)
    sent = HeartbeatRequest(member_epoch=3, member_id="m-1", stuck=[call]).to_json()
    assert sent["stuck"] == [
        {"topic": "orders", "partition": 2, "key_hash": 2**63 - 1, "offset": 41, "running_s": 12.5}
    ]
    assert json.loads(json.dumps(sent)) == sent


async def test_a_reported_stuck_call_reaches_the_coordinators_description(
    coordinator: CoordinatorClient, coordinator_app: FastAPI
) -> None:
    g = group()
    joined = await coordinator.heartbeat(
        g, HeartbeatRequest(member_epoch=0, subscribed_topics=["t"])
    )
    await coordinator.heartbeat(
        g,
        HeartbeatRequest(
            member_epoch=joined.member_epoch,
            member_id=joined.member_id,
            stuck=[StuckCall("t", 0, 77, 1234, 8.0)],
        ),
    )
    transport = httpx.ASGITransport(app=coordinator_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as admin:
        described = (await admin.get(f"/v1/admin/groups/{g}")).json()
    (stuck,) = described["members"][0]["stuck"]
    assert (stuck["topic"], stuck["partition"], stuck["key_hash"], stuck["offset"]) == (
        "t",
        0,
        77,
        1234,
    )
    assert stuck["running_s"] == 8.0


async def test_an_endpoint_advertised_at_the_join_comes_back_with_the_owner(
    coordinator: CoordinatorClient, coordinator_app: FastAPI
) -> None:
    """Sent only when advertised (an older coordinator refuses the field), and returned by
    the owner look-up with the member that owns the key."""
    assert "endpoint" not in HeartbeatRequest(member_epoch=3, member_id="m-1").to_json()
    await given_topics(coordinator_app, served=1)
    g = group()
    joined = await coordinator.heartbeat(
        g,
        HeartbeatRequest(
            member_epoch=0, subscribed_topics=["served"], endpoint="http://127.0.0.1:7070"
        ),
    )
    await coordinator.heartbeat(
        g,
        HeartbeatRequest(
            member_epoch=joined.member_epoch,
            member_id=joined.member_id,
            owned=joined.assignment,
        ),
    )
    owner = (await coordinator.group_owners(g)).owner_of("served", 0, 12345)
    assert owner == KeyOwner(joined.member_id, joined.member_id, "http://127.0.0.1:7070")


async def test_an_unreachable_coordinator_is_coordinator_unavailable() -> None:
    async with CoordinatorClient(f"http://127.0.0.1:{free_port()}", max_retries=1) as client:
        with pytest.raises(errors.CoordinatorUnavailable):
            await client.fetch_offsets("g")


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8080", "coordinator:8080", "ftp://coordinator", "http://", "/v1"]
)
def test_a_coordinator_url_that_cannot_be_one_is_refused_at_once(url: str) -> None:
    """Without a scheme httpx reads the URL as a path: refused, not retried for a minute."""
    with pytest.raises(ValueError, match="is not an http:// or https:// URL with a host"):
        CoordinatorClient(url)


async def test_owner_look_ups_are_retried_map_errors_and_carry_the_token() -> None:
    """What ``StreamsApp.query`` asks for a key it does not hold (issue 28: before, its own
    HTTP client, with no retries, no error mapping)."""
    described = {
        "group_id": "g",
        "group_epoch": 3,
        "owners": [
            {
                "member_id": "m-1",
                "instance_id": None,
                "endpoint": None,
                "topic": "t",
                "partition": 0,
                "ranges": [[0, 9]],
            },
            {
                "member_id": "m-2",
                "instance_id": "b",
                "endpoint": "http://b:7070",
                "topic": "t",
                "partition": 0,
                "ranges": [[10, 20]],
            },
        ],
    }
    stub = Stub(
        problem(503, "SERVICE_UNAVAILABLE"),
        (200, described),
        (200, described),
        (200, described),
        problem(404, "GROUP_ID_NOT_FOUND"),
        problem(403, "FORBIDDEN"),
    )
    async with CoordinatorClient("http://c", token="adm", transport=httpx.MockTransport(stub)) as c:
        assert (await c.group_owners("g")).owner_of("t", 0, 5) == KeyOwner("m-1", "m-1")
        owners = await c.group_owners("g")
        assert owners.owner_of("t", 0, 15) == KeyOwner("b", "m-2", "http://b:7070")
        assert (await c.group_owners("g")).owner_of("t", 0, 21) is None
        assert (await c.group_owners("gone")).owner_of("t", 0, 5) is None
        with pytest.raises(errors.Forbidden):
            await c.group_owners("g")
    assert [r.url.path for r in stub.requests][-2:] == [
        "/v1/groups/gone/owners",
        "/v1/groups/g/owners",
    ]
    assert {r.headers["authorization"] for r in stub.requests} == {"Bearer adm"}
