"""While Postgres is down, every request gets a 503 problem the SDK retries, handled like any
other database error: reaching a stopped server over its unix socket fails with an ``OSError``
(``FileNotFoundError``; over TCP ``ConnectionRefusedError``) that SQLAlchemy passes through
unwrapped, and it once escaped the handlers as an unhandled exception with an ERROR traceback
per request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from coordinator import migrate
from coordinator.app import create_app
from coordinator.embedded import EmbeddedPostgres
from tests.fixtures.coordinator import settings_for_tests

pytestmark = pytest.mark.db


async def test_requests_while_postgres_is_stopped_get_503_and_none_escapes(tmp_path: Path) -> None:
    async with EmbeddedPostgres(tmp_path / "postgres") as postgres:
        url = await asyncio.to_thread(postgres.create_database, "outage")
        await asyncio.to_thread(migrate.upgrade, url)
        app = create_app(settings_for_tests(), url)
        async with app.router.lifespan_context(app):
            # An exception no handler took is raised here by the transport, not answered.
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as api:
                assert (await api.get("/v1/admin/groups")).status_code == 200
                await asyncio.to_thread(postgres.stop)
                try:
                    # The first request may meet a pooled connection the stop broke; the
                    # next ones have to open new connections to the stopped server.
                    replies = [await api.get("/v1/admin/groups") for _ in range(4)]
                finally:
                    await asyncio.to_thread(postgres.start)
                assert [reply.status_code for reply in replies] == [503] * 4
                assert {reply.json()["error"] for reply in replies} == {"SERVICE_UNAVAILABLE"}
