"""Alembic owns the schema: the models must match it, and every migration must reverse."""

from __future__ import annotations

import asyncio

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator import migrate
from coordinator.db.models import Base
from tests.fixtures.coordinator import MakeDatabase


def _diff(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


async def test_models_and_migrations_agree(make_migrated_database: MakeDatabase) -> None:
    url = await make_migrated_database()
    engine = create_async_engine(url)
    async with engine.connect() as connection:
        assert await connection.run_sync(_diff) == []
    await engine.dispose()


async def test_downgrade_to_base_and_upgrade_again(make_migrated_database: MakeDatabase) -> None:
    url = await make_migrated_database()
    config = migrate.alembic_config(url)
    engine = create_async_engine(url)
    await asyncio.to_thread(command.downgrade, config, "0001")
    async with engine.connect() as connection:
        assert "members" not in await connection.run_sync(_tables)
        assert "partition_offsets" in await connection.run_sync(_tables)
    await asyncio.to_thread(command.downgrade, config, "base")
    async with engine.connect() as connection:
        assert await connection.run_sync(_tables) == {"alembic_version"}
    await asyncio.to_thread(command.upgrade, config, "head")
    async with engine.connect() as connection:
        assert await connection.run_sync(_diff) == []
    await engine.dispose()
