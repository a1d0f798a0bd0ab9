"""Alembic environment, async: the coordinator migrates through the same asyncpg driver it
serves with, and tests hand in an open connection so migrations run on the test database."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator.db.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("KEYRANGE_DATABASE_URL")
    if not url:
        raise SystemExit("no database URL: set KEYRANGE_DATABASE_URL")
    return url


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
    else:
        asyncio.run(_run_async(_url()))
