"""Apply Alembic migrations from code, so `keyrange migrate` and start-up migration work from
an installed package without an alembic.ini beside it."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

import migrations

log = logging.getLogger(__name__)


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    log.info("applying migrations", extra={"revision": revision})
    command.upgrade(alembic_config(database_url), revision)


async def wait_for_database(database_url: str, timeout_s: float) -> None:
    """Block until the database answers, so a migration Job can start before Postgres."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        engine = create_async_engine(database_url)
        try:
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
            return
        except Exception as exc:
            if time.monotonic() >= deadline:
                raise SystemExit(
                    f"database not reachable after {timeout_s:.0f}s: {type(exc).__name__}"
                ) from None
            log.info("waiting for the database", extra={"attempt": attempt})
            await asyncio.sleep(min(2.0, 0.2 * attempt))
        finally:
            await engine.dispose()
