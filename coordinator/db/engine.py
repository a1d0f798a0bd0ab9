"""Engine and transaction scope. One request is one transaction: the dependency commits
when the handler returns and rolls back when it raises, so services never commit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, cast

import asyncpg
from fastapi import Depends
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from starlette.requests import Request

from coordinator.settings import Settings


def make_engine(url: str, settings: Settings) -> AsyncEngine:
    return create_async_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        # No pre-ping: it costs round trips on every request (a measured fifth of a commit's
        # CPU). A connection that died with the database fails one request with 503, which
        # clients retry, and is replaced; recycling bounds how stale a connection gets.
        pool_recycle=1800,
        connect_args={
            "server_settings": {
                "application_name": "keyrange-coordinator",
                "statement_timeout": str(settings.db_statement_timeout_ms),
            }
        },
    )


async def transaction(request: Request) -> AsyncIterator[AsyncConnection]:
    engine: AsyncEngine = request.app.state.engine
    async with engine.begin() as connection:
        yield connection


# The request's transaction as a route parameter. Committed when the handler returns, before
# the reply is sent (FastAPI's default for dependencies with yield is after): a client that
# reads right after a 200 sees its write, and a commit that fails is the request's error,
# never a 200 followed by a rollback.
Transaction = Annotated[AsyncConnection, Depends(transaction, scope="function")]


async def driver_connection(connection: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under ``connection``, for statements written for the driver
    (the offset store's row locks and writes, which commit batches run) inside the same
    transaction.

    SQLAlchemy begins the database transaction at its first statement, so the caller must
    have run one: a driver statement before it would commit on its own.
    """
    raw = await connection.get_raw_connection()
    driver = cast(asyncpg.Connection, raw.driver_connection)
    if not driver.is_in_transaction():
        raise RuntimeError("driver statements need the transaction begun by a statement first")
    return driver
