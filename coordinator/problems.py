"""Every error a request can meet, rendered as an RFC 9457 problem document with its error
name (docs/design.md §3): one function, so the FastAPI handlers and the commit fast path
answer alike; and the same documents as the OpenAPI description declares them, route by
route."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from client.protocol import error_names as names
from coordinator import metrics
from coordinator.errors import KeyrangeError, PathNotFound, QuotaExceeded

log = logging.getLogger(__name__)

PROBLEM = "application/problem+json"

# deadlock_detected, serialization_failure
_RETRIABLE_SQLSTATES = {"40P01", "40001"}

# Commits run on the driver connection (coordinator.offsets.batching), so the driver's own
# errors reach here unwrapped: the database gone or going away.
_DATABASE_GONE = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
)


def database_gone(exc: BaseException) -> bool:
    """The database unreachable, restarting or gone mid-query. A query whose connection the
    server closed under it (a restart, a failover) reaches here as a plain ``DBAPIError``
    that SQLAlchemy marks ``connection_invalidated``, the driver's error as its cause."""
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeout, *_DATABASE_GONE)):
        return True
    if isinstance(exc, DBAPIError):
        driver_error = exc.orig.__cause__ if exc.orig is not None else None
        return exc.connection_invalidated or isinstance(driver_error, _DATABASE_GONE)
    return False


class Problem(BaseModel):
    """An RFC 9457 problem document with Keyrange's ``error`` name; some carry more members
    (``errors`` for validation, ``live_members`` for ``GROUP_NOT_EMPTY``)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    error: str
    errors: list[dict[str, str]] | None = None


# What each status means on any route that declares it (docs/api.md, "Errors").
_MEANINGS = {
    400: "INVALID_REQUEST: malformed JSON, failed validation, or a request the state refuses",
    401: "UNAUTHORIZED: no bearer token, an unknown one, or more than one Authorization header",
    403: "FORBIDDEN: the token lacks the route's scope or the group's prefix",
    404: "GROUP_ID_NOT_FOUND: the group does not exist",
    409: "A conflict with the group's state: FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, "
    "INDIVIDUAL_COMMIT_NOT_ALLOWED or GROUP_NOT_EMPTY",
    413: "INVALID_REQUEST: the body is over KEYRANGE_MAX_BODY_BYTES",
    429: "A per-tenant cap was reached; the error names which",
    503: "SERVICE_UNAVAILABLE: the database is unreachable or aborted the transaction; retry",
}
_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

# Every route that takes a token can answer these before its own work begins.
TOKEN_ROUTE_ERRORS = (401, 403, 413)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of these statuses, as problem documents."""
    return {
        status: {
            "description": _MEANINGS[status],
            "content": {PROBLEM: {"schema": _PROBLEM_REF}},
        }
        for status in statuses
    }


def declare_problems(openapi: dict[str, Any]) -> None:
    """Complete the OpenAPI document FastAPI built: the ``Problem`` schema the routes' error
    responses refer to, and none of FastAPI's 422 validation answers, which this
    coordinator never gives (validation fails with a 400 problem document)."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = Problem.model_json_schema()
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    for operations in openapi.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)


def problem(status: int, error: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    body["error"] = error
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM)


def error_response(exc: Exception) -> JSONResponse:
    """The problem document for any exception a request raised; call it in its handler."""
    if isinstance(exc, KeyrangeError):
        if isinstance(exc, QuotaExceeded):
            metrics.QUOTA_REFUSALS.labels(exc.cap).inc()
        return problem(exc.status, exc.error, exc.title, exc.detail, **exc.extra)
    if isinstance(exc, RequestValidationError):
        # Echoing the input back could return megabytes; the location and message suffice.
        located = [
            (".".join(str(part) for part in e.get("loc", ())), str(e.get("msg", "")))
            for e in exc.errors()[:20]
        ]
        errors = [{"loc": loc, "msg": msg} for loc, msg in located]
        loc, msg = located[0] if located else ("", "invalid request")
        detail = f"{loc}: {msg}" if loc else msg
        return problem(400, names.INVALID_REQUEST, "Invalid request", detail, errors=errors)
    if isinstance(exc, StarletteHTTPException) and exc.status_code == 404:
        return problem(404, names.NOT_FOUND, PathNotFound.title, str(exc.detail))
    if isinstance(exc, StarletteHTTPException):
        response = problem(
            exc.status_code, names.INVALID_REQUEST, "Request not served", str(exc.detail)
        )
        # A 405's Allow header lists the methods the path does serve.
        response.headers.update(exc.headers or {})
        return response
    if database_gone(exc):
        log.warning("database unavailable", extra={"error": type(exc).__name__})
        return problem(
            503, names.SERVICE_UNAVAILABLE, "Service unavailable", "the database is not reachable"
        )
    # Postgres aborted the transaction to break a lock cycle or a serialisation conflict:
    # nothing was applied and the same request will succeed when retried.
    sqlstate = getattr(exc.orig if isinstance(exc, DBAPIError) else exc, "sqlstate", None)
    if isinstance(exc, DBAPIError | asyncpg.PostgresError) and sqlstate in _RETRIABLE_SQLSTATES:
        log.warning("transaction aborted by the database", extra={"error": type(exc).__name__})
        return problem(
            503, names.SERVICE_UNAVAILABLE, "Service unavailable", "transaction conflict; retry"
        )
    log.exception("unexpected error", extra={"error": type(exc).__name__})
    return problem(500, names.INTERNAL_ERROR, "Internal error", "unexpected error; see the logs")
