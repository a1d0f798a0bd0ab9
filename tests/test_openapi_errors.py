"""The OpenAPI document tells the truth about errors: each route declares the problem
documents it can answer, as application/problem+json, and none of FastAPI's 422s (validation
fails with 400 here). Conformance of real answers is fuzzed in tests/test_fuzz_api.py."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.app import create_app
from coordinator.auth import PUBLIC_PATHS
from tests.fixtures.coordinator import settings_for_tests

OPENAPI = create_app(settings_for_tests(), "postgresql+asyncpg://unused/unused").openapi()
OPERATIONS = [
    pytest.param(path, method, operation, id=f"{method.upper()} {path}")
    for path, methods in OPENAPI["paths"].items()
    for method, operation in methods.items()
]


@pytest.mark.parametrize(("path", "method", "operation"), OPERATIONS)
def test_every_error_response_is_a_problem_document(
    path: str, method: str, operation: dict[str, Any]
) -> None:
    responses = operation["responses"]
    assert "422" not in responses
    errors = {status: r for status, r in responses.items() if not status.startswith("2")}
    assert "413" in errors
    for status, response in errors.items():
        assert list(response["content"]) == ["application/problem+json"], status
        assert response["content"]["application/problem+json"]["schema"] == {
            "$ref": "#/components/schemas/Problem"
        }
    if path not in PUBLIC_PATHS:
        assert "401" in errors
    if path.startswith("/v1/admin") or path.startswith("/v1/groups"):
        assert "403" in errors
    if "{" in path or "requestBody" in operation:
        assert "400" in errors


def test_the_problem_schema_requires_the_error_name() -> None:
    schemas = OPENAPI["components"]["schemas"]
    assert {"type", "title", "status", "detail", "error"} <= set(schemas["Problem"]["required"])
    assert "HTTPValidationError" not in schemas
