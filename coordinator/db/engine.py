"""Engine and transaction scope. One request is one transaction: the dependency commits
when the handler returns and rolls back when it raises, so services never commit."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
