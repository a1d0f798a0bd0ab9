"""Counting the session renewals' statements, which run on the asyncpg driver connection,
below SQLAlchemy's events (``coordinator/groups/renewals.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine


def count_renewal_statements(engine: AsyncEngine) -> Callable[[], int]:
    """How many renewal statements ``engine`` has run, on the connections it opens from now
    on (a connection already in its pool reports nothing)."""
    counted = 0

    def count(query: Any) -> None:
        nonlocal counted
        counted += "WITH renewable" in query.query

    @event.listens_for(engine.sync_engine, "connect")
    def _log_queries(dbapi_connection: Any, _: object) -> None:
        driver: asyncpg.Connection = dbapi_connection.driver_connection
        driver.add_query_logger(count)

    return lambda: counted
