"""The query routes' own rules, without a broker: how a key is read from a URL and written
back, and how the instance keeps the coordinator's verdicts on callers' tokens (the
coordinator is an HTTP stub here; the real one is in test_queries_http.py)."""

from __future__ import annotations

import asyncio
import base64
import socket

import httpx
import pytest

from client.http import CoordinatorClient
from client.streams.queries import StoreQueries
from client.streams.query_auth import CallerCheck, Refusal
from client.streams.query_server import QueryServer, QueryServerError
from client.streams.routes import _BadRequest, _key, _rendered
from client.streams.serde import BYTES, INT64, JSON, STRING
from tests.streams.harness import count_topology


def test_a_key_is_its_serialized_bytes_as_text_or_base64url() -> None:
    assert _key(STRING, "fox ü".encode(), {}) == "fox ü"
    assert _key(JSON, b'{"id":7}', {}) == {"id": 7}
    raw = base64.urlsafe_b64encode((42).to_bytes(8, "big")).rstrip(b"=")
    assert _key(INT64, raw, {"key_encoding": "base64"}) == 42
    for serde, raw, params in [
        (JSON, b"{not json", {}),
        (STRING, b"!!", {"key_encoding": "base64"}),
        (STRING, b"k", {"key_encoding": "latin-1"}),
        (JSON, b"null", {}),
    ]:
        with pytest.raises(_BadRequest):
            _key(serde, raw, params)


def test_values_json_cannot_say_come_back_as_base64url() -> None:
    assert _rendered("value", {"n": 1}, JSON) == {"value": {"n": 1}}
    assert _rendered("value", 7, INT64) == {"value": 7}
    assert _rendered("value", b"\x00\xff", BYTES) == {"value_base64": "AP8="}


def stub(*statuses: int) -> tuple[httpx.AsyncClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    replies = list(statuses)

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = replies.pop(0)
        if status == 0:
            raise httpx.ConnectError("refused", request=request)
        if status == 403:
            return httpx.Response(status, json={"error": "FORBIDDEN", "detail": "no"})
        if status == 404:
            return httpx.Response(status, json={"error": "GROUP_ID_NOT_FOUND", "detail": "no"})
        if status == 4040:
            return httpx.Response(404, text="<html>Not Found</html>")
        return httpx.Response(status, json={"partitions": []})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer)), seen


async def test_verdicts_are_kept_per_token_and_failures_to_ask_are_not() -> None:
    http, seen = stub(200, 403, 0, 503, 4040, 404)
    async with http:
        check = CallerCheck(http, "http://coordinator/", "iq-app", "words")
        assert await check.refusal("Bearer good") is None
        assert await check.refusal("Bearer good") is None
        assert await check.refusal("Bearer other") == Refusal(403, "FORBIDDEN", "no")
        assert await check.refusal("Bearer other") == Refusal(403, "FORBIDDEN", "no")
        # The coordinator unreachable, then failing: nobody is admitted, nothing is kept.
        assert (await check.refusal(None) or Refusal(0, "", "")).status == 503
        assert (await check.refusal(None) or Refusal(0, "", "")).status == 503
        # A 404 that is not the coordinator's (a proxy, a wrong URL) says nothing of anyone.
        bare = await check.refusal(None)
        assert bare is not None and (bare.status, bare.error) == (503, "COORDINATOR_UNAVAILABLE")
        assert "coordinator_url" in bare.detail
        # A group that does not exist yet: the token was still good for it.
        assert await check.refusal(None) is None
    assert [str(r.url) for r in seen[:1]] == [
        "http://coordinator/v1/groups/iq-app/offsets?topic=words&partition=0"
    ]
    assert [r.headers.get("authorization") for r in seen] == [
        "Bearer good",
        "Bearer other",
        None,
        None,
        None,
        None,
    ]


async def test_the_advertised_address_is_the_hosts_name_and_the_bound_port() -> None:
    topology = count_topology("words", "counts").build()
    async with CoordinatorClient("http://coordinator") as coordinator:
        queries = StoreQueries(topology, "iq-x", coordinator, {}, lambda: None)
        servers = [
            QueryServer("127.0.0.1", 0, None),
            QueryServer("0.0.0.0", 0, None),
            QueryServer("127.0.0.1", 0, "https://streams-0.example/queries/"),
        ]
        for server in servers:
            assert not server.listening
            server.start(
                queries,
                coordinator_url="http://coordinator",
                group_id="iq-x",
                name=str,
                credential=None,
            )
        try:
            ports = [server._server.server_port for server in servers if server._server]
            assert [server.endpoint for server in servers] == [
                f"http://127.0.0.1:{ports[0]}",
                f"http://{socket.gethostname()}:{ports[1]}",
                "https://streams-0.example/queries",
            ]
            with pytest.raises(QueryServerError, match="cannot serve queries"):
                QueryServer("127.0.0.1", ports[0], None).start(
                    queries,
                    coordinator_url="http://coordinator",
                    group_id="iq-x",
                    name=str,
                    credential=None,
                )
        finally:
            for server in servers:
                await server.stop()
        assert not any(server.listening for server in servers)


async def test_one_description_of_the_group_serves_the_owner_look_ups_until_forgotten() -> None:
    described = {
        "group_id": "iq-x",
        "group_epoch": 4,
        "owners": [
            {
                "member_id": "m-1",
                "instance_id": "b",
                "endpoint": "http://b:7070",
                "topic": "words",
                "partition": 0,
                "ranges": [[0, 2**63 - 1]],
            }
        ],
    }
    asked: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json=described)

    topology = count_topology("words", "counts").build()
    transport = httpx.MockTransport(answer)
    async with CoordinatorClient("http://coordinator", transport=transport) as coordinator:
        queries = StoreQueries(topology, "iq-x", coordinator, {"words": 1}, lambda: None)
        located = queries.locate("counts", "fox")
        owners = await asyncio.gather(*(queries.owner(located) for _ in range(5)))
        assert {owner.endpoint for owner in owners if owner} == {"http://b:7070"}
        assert len(asked) == 1, "concurrent look-ups share one description"
        assert (await queries.query("counts", "fox")).owner == "b"
        assert len(asked) == 1
        queries.forget_owners()
        await queries.owner(located)
        assert len(asked) == 2
