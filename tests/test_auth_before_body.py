"""Who before what: every route checks the token from the headers before it reads or parses
the body, the commit fast path included, so an anonymous caller learns nothing about what the
coordinator would have made of its request; two ``Authorization`` headers are refused alike
everywhere."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from coordinator.app import create_app
from coordinator.auth import PUBLIC_PATHS
from tests.fixtures.coordinator import RunningCoordinator, settings_for_tests

StartCoordinator = Callable[..., Awaitable[RunningCoordinator]]

ADMIN = "admin-secret-token"
CLIENT = "client-secret-token"
TOKENS = {"admin_tokens": [ADMIN], "client_tokens": [{"token": CLIENT, "group_prefixes": ["a."]}]}
FOUR_MIB = 4 * 1024 * 1024
# A body no route could accept: its validation errors would echo field names and messages.
GARBAGE = b'{"member_epoch": "zero", "partitions": [{"topic": "\\u0000"}], "x": [1, 2'

# Path parameters in a form every route accepts, so only the token decides.
SAMPLE_PARAMETERS = {"group_id": "a.group", "topic": "orders", "member_id": "m-1"}


def token_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) of the API that takes a token, from its OpenAPI document, with
    sample path parameters."""
    found = []
    for template, operations in app.openapi()["paths"].items():
        if template in PUBLIC_PATHS:
            continue
        path = re.sub(r"{(\w+)}", lambda m: SAMPLE_PARAMETERS[m.group(1)], template)
        found.extend((method.upper(), path) for method in sorted(operations))
    return found


ROUTES = token_routes(create_app(settings_for_tests(), "postgresql+asyncpg://unused/unused"))


@pytest_asyncio.fixture(scope="module")
async def secured(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings_for_tests(**TOKENS), database_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client


@pytest_asyncio.fixture(scope="module")
async def served_url(start_coordinator: StartCoordinator, database_url: str) -> str:
    """The same coordinator on a real port, where a body can be declared and not sent."""
    return (await start_coordinator(database_url, **TOKENS)).url


def test_the_route_list_covers_the_api() -> None:
    paths = {path for _, path in ROUTES}
    assert "/v1/groups/a.group/offsets/commit" in paths
    assert "/v1/groups/a.group/heartbeat" in paths
    assert "/v1/admin/config" in paths
    assert "/v1/limits" in paths


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic abc"])
async def test_a_caller_without_a_valid_token_sees_401_and_nothing_of_its_body(
    secured: httpx.AsyncClient, method: str, path: str, authorization: str | None
) -> None:
    headers = {"content-type": "application/json"}
    if authorization is not None:
        headers["authorization"] = authorization
    reply = await secured.request(method, path, content=GARBAGE, headers=headers)
    assert reply.status_code == 401, reply.text
    problem = reply.json()
    assert problem["error"] == "UNAUTHORIZED"
    assert "errors" not in problem
    assert reply.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_two_authorization_headers_are_refused_on_every_route(
    secured: httpx.AsyncClient, method: str, path: str
) -> None:
    headers = [("authorization", f"Bearer {ADMIN}"), ("authorization", f"Bearer {ADMIN}")]
    reply = await secured.request(method, path, content=GARBAGE, headers=headers)
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"] == "UNAUTHORIZED"
    assert "more than one Authorization header" in reply.json()["detail"]


@pytest.mark.parametrize(("method", "path"), [(m, p) for m, p in ROUTES if "/v1/admin" in p])
async def test_a_client_token_on_an_admin_route_sees_403_and_nothing_of_its_body(
    secured: httpx.AsyncClient, method: str, path: str
) -> None:
    headers = {"content-type": "application/json", "authorization": f"Bearer {CLIENT}"}
    reply = await secured.request(method, path, content=GARBAGE, headers=headers)
    assert reply.status_code == 403, reply.text
    assert "errors" not in reply.json()


async def test_a_group_outside_the_token_prefixes_is_refused_before_the_body(
    secured: httpx.AsyncClient,
) -> None:
    headers = {"content-type": "application/json", "authorization": f"Bearer {CLIENT}"}
    for path in ("/v1/groups/b.group/offsets/commit", "/v1/groups/b.group/heartbeat"):
        reply = await secured.post(path, content=GARBAGE, headers=headers)
        assert reply.status_code == 403, reply.text
        assert "errors" not in reply.json()


async def answer_to_headers_alone(url: str, method: str, path: str, headers: str) -> bytes:
    """The status line the coordinator answers to a request that declares a 4 MiB body and
    sends none of it: answering at all proves the body was never waited for."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: c\r\nContent-Type: application/json\r\n"
            f"Content-Length: {FOUR_MIB}\r\n{headers}\r\n".encode()
        )
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "path",
    [
        "/v1/groups/a.group/offsets/commit",
        "/v1/groups/a.group/heartbeat",
        "/v1/admin/groups/a.group/offsets/reset",
    ],
)
async def test_an_anonymous_4_mib_body_is_refused_without_being_read(
    served_url: str, path: str
) -> None:
    for headers in ("", "Authorization: Bearer wrong\r\n"):
        status = await answer_to_headers_alone(served_url, "POST", path, headers)
        assert status.split()[1] == b"401", status


async def test_a_valid_token_still_reaches_validation_details(secured: httpx.AsyncClient) -> None:
    reply = await secured.post(
        "/v1/groups/a.group/offsets/commit",
        content=json.dumps({"partitions": []}),
        headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT}"},
    )
    assert reply.status_code == 400
    assert reply.json()["errors"]
