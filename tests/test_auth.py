"""Bearer tokens, scopes, group prefixes, and the loopback-only rule without tokens."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from coordinator.app import create_app
from coordinator.settings import Settings
from tests.fixtures.coordinator import MakeDatabase, settings_for_tests

ADMIN = "admin-secret-token"
CLIENT = "client-secret-token"


@pytest_asyncio.fixture(scope="module")
async def secured(make_migrated_database: MakeDatabase) -> AsyncIterator[httpx.AsyncClient]:
    settings = settings_for_tests(
        admin_tokens=[ADMIN],
        client_tokens=[{"token": CLIENT, "group_prefixes": ["team-a."]}],
    )
    app = create_app(settings, await make_migrated_database())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


COMMIT = {"partitions": [{"topic": "t", "partition": 0, "offset": 1}]}


async def test_missing_or_unknown_token_is_unauthorized(secured: httpx.AsyncClient) -> None:
    for headers in ({}, bearer("wrong"), {"Authorization": "Basic abc"}):
        reply = await secured.post(
            "/v1/groups/team-a.x/offsets/commit", json=COMMIT, headers=headers
        )
        assert reply.status_code == 401
        assert reply.json()["error"] == "UNAUTHORIZED"


async def test_client_token_is_limited_to_its_prefixes_and_scope(
    secured: httpx.AsyncClient,
) -> None:
    ok = await secured.post(
        "/v1/groups/team-a.x/offsets/commit", json=COMMIT, headers=bearer(CLIENT)
    )
    assert ok.status_code == 200
    other = await secured.post(
        "/v1/groups/team-b.x/offsets/commit", json=COMMIT, headers=bearer(CLIENT)
    )
    assert other.status_code == 403
    assert other.json()["error"] == "FORBIDDEN"
    admin_route = await secured.get("/v1/admin/groups", headers=bearer(CLIENT))
    assert admin_route.status_code == 403


async def test_admin_token_reaches_every_route(secured: httpx.AsyncClient) -> None:
    assert (await secured.get("/v1/admin/groups", headers=bearer(ADMIN))).status_code == 200
    reply = await secured.post(
        "/v1/groups/team-b.y/offsets/commit", json=COMMIT, headers=bearer(ADMIN)
    )
    assert reply.status_code == 200


async def test_probes_need_no_token(secured: httpx.AsyncClient) -> None:
    assert (await secured.get("/livez")).status_code == 200
    assert (await secured.get("/readyz")).status_code == 200


async def test_tokens_never_reach_the_logs(
    secured: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await secured.post("/v1/groups/team-a.z/offsets/commit", json=COMMIT, headers=bearer(CLIENT))
    await secured.get("/v1/admin/groups", headers=bearer("not-a-real-token-value"))
    text = caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    assert CLIENT not in text
    assert "not-a-real-token-value" not in text


def test_without_tokens_only_loopback_is_allowed() -> None:
    Settings(host="127.0.0.1").check_bind_address()
    Settings(host="::1").check_bind_address()
    Settings(host="localhost").check_bind_address()
    with pytest.raises(ValueError, match="without API tokens"):
        Settings(host="0.0.0.0").check_bind_address()
    Settings(host="0.0.0.0", admin_tokens=["x"]).check_bind_address()


def test_settings_never_show_tokens() -> None:
    settings = Settings(admin_tokens=[ADMIN], client_tokens=[{"token": CLIENT}])
    assert ADMIN not in repr(settings)
    assert CLIENT not in repr(settings)


def test_plain_postgres_urls_select_the_asyncpg_driver() -> None:
    for given in ("postgresql://u:p@db:5432/k", "postgres://u:p@db:5432/k"):
        url = Settings(database_url=given).database_url
        assert url is not None
        assert url.get_secret_value() == "postgresql+asyncpg://u:p@db:5432/k"
    with pytest.raises(ValueError, match="postgresql"):
        Settings(database_url="mysql://u@db/k")


async def test_the_limits_need_a_valid_token_of_either_scope(secured: httpx.AsyncClient) -> None:
    assert (await secured.get("/v1/limits")).status_code == 401
    for token in (CLIENT, ADMIN):
        reply = await secured.get("/v1/limits", headers=bearer(token))
        assert reply.status_code == 200
        assert reply.json() == {
            "max_ranges_per_request": 60_000,
            "max_partitions_per_request": 10_000,
            "max_metadata_chars": 4_096,
            "max_body_bytes": 4_194_304,
        }
