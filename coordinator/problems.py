"""Every error a request can meet, rendered as an RFC 9457 problem document with its DESIGN
name: one function, so the FastAPI handlers and the commit fast path answer alike."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from client.protocol import error_names as names
from coordinator import metrics
from coordinator.errors import KeyrangeError, QuotaExceeded

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
    if isinstance(exc, StarletteHTTPException):
        return problem(
            exc.status_code, names.INVALID_REQUEST, "Request not served", str(exc.detail)
        )
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeout, *_DATABASE_GONE)):
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
