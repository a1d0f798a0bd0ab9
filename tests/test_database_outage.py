"""While Postgres is down, every request gets a 503 problem the SDK retries, handled like any
other database error: reaching a stopped server over its unix socket fails with an ``OSError``
(``FileNotFoundError``; over TCP ``ConnectionRefusedError``) that SQLAlchemy passes through
unwrapped, and it once escaped the handlers as an unhandled exception with an ERROR traceback
per request."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from coordinator import migrate
from coordinator.app import create_app
from coordinator.embedded import EmbeddedPostgres
from coordinator.problems import error_response
from tests.fixtures.coordinator import settings_for_tests
from tests.waiting import until

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


async def test_a_query_whose_connection_the_server_closed_mid_flight_is_a_503(
    tmp_path: Path,
) -> None:
    """What a Postgres restart or failover does to the queries running at that instant:
    SQLAlchemy wraps the driver's error in a plain ``DBAPIError`` (its connection marked
    invalidated), which was answered 500 with an ERROR traceback instead of a retriable 503."""
    async with EmbeddedPostgres(tmp_path / "postgres") as postgres:
        engine = create_async_engine(postgres.url())
        try:

            async def query_in_flight() -> None:
                async with engine.connect() as connection:
                    await connection.execute(text("SELECT pg_sleep(30)"))

            running = asyncio.create_task(query_in_flight())
            async with engine.connect() as admin:
                await until(lambda: _sleeping(admin), 10, "the query to run on the server")
                await admin.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE query = 'SELECT pg_sleep(30)'"
                    )
                )
            with pytest.raises(DBAPIError) as raised:
                await running
        finally:
            await engine.dispose()
    reply = error_response(raised.value)
    assert reply.status_code == 503
    assert json.loads(reply.body)["error"] == "SERVICE_UNAVAILABLE"


async def _sleeping(admin: AsyncConnection) -> bool:
    found = await admin.execute(
        text("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'")
    )
    sleeping = bool(found.scalar_one())
    # pg_stat_activity is read once per transaction: without ending it, a first look taken
    # before the query started (a loaded machine) is all every later look sees.
    await admin.rollback()
    return sleeping


async def test_background_loops_meeting_a_stopped_database_warn_without_tracebacks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An outage operators expect (a restart, a failover) is logged as a warning each time a
    loop retries; ERROR with a traceback every second per loop buried the real errors."""
    caplog.set_level(logging.WARNING, logger="coordinator")
    async with EmbeddedPostgres(tmp_path / "postgres") as postgres:
        url = await asyncio.to_thread(postgres.create_database, "loops")
        await asyncio.to_thread(migrate.upgrade, url)
        app = create_app(settings_for_tests(), url)
        async with app.router.lifespan_context(app):
            await asyncio.to_thread(postgres.stop)
            try:
                await until(
                    lambda: _retried_loops(caplog) >= {"membership-reaper", "membership-watch"},
                    30,
                    "the reaper and the watch to meet the stopped database",
                )
            finally:
                await asyncio.to_thread(postgres.start)
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert [record.getMessage() for record in errors] == []


def _retried_loops(caplog: pytest.LogCaptureFixture) -> set[str]:
    return {
        str(getattr(record, "loop", ""))
        for record in caplog.records
        if record.name == "coordinator.app" and "loop" in record.__dict__
    }
