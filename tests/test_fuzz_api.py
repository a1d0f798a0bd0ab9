"""Property-based fuzzing of every route from the OpenAPI document: whatever the input (valid
and invalid, NUL characters included), the coordinator answers with no 5xx and only with what
the document declares: a declared status, media type, headers and body schema."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from coordinator.app import create_app
from tests.fixtures.coordinator import MakeDatabase, free_port, settings_for_tests

# The schema is the application's own; building the app does no I/O until its lifespan runs.
SCHEMA = schemathesis.openapi.from_dict(
    create_app(settings_for_tests(), "postgresql+asyncpg://unused/unused").openapi()
)


@pytest.fixture(scope="module")
def served_url(make_migrated_database: MakeDatabase) -> Iterator[str]:
    """A coordinator in its own thread and event loop, so schemathesis' blocking HTTP calls
    don't stall the test loop."""
    result: dict[str, str] = {}

    def make_db() -> None:
        result["url"] = asyncio.run(make_migrated_database())

    maker = threading.Thread(target=make_db)
    maker.start()
    maker.join()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings_for_tests(), result["url"]),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        threading.Event().wait(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


# Not only "no 5xx": every answer is one the OpenAPI document declares, with the declared
# media type, headers and body schema (problem documents included).
CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@SCHEMA.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_every_answer_is_a_declared_one(case: schemathesis.Case, served_url: str) -> None:
    response = case.call(base_url=served_url, timeout=30)
    case.validate_response(response, checks=CONFORMANCE)
