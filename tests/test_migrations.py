"""Alembic owns the schema: the models must match it, and every migration must reverse."""

from __future__ import annotations

import asyncio

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from coordinator import migrate
from coordinator.db.models import Base
from tests.fixtures.coordinator import MakeDatabase


def _diff(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


def _columns(connection: Connection, table: str) -> set[str]:
    return {column["name"] for column in inspect(connection).get_columns(table)}


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
    await asyncio.to_thread(command.downgrade, config, "0005")
    async with engine.connect() as connection:
        columns = await connection.run_sync(_columns, "members")
        assert "standbys" not in columns and "endpoint" in columns
    await asyncio.to_thread(command.downgrade, config, "0004")
    async with engine.connect() as connection:
        assert "endpoint" not in await connection.run_sync(_columns, "members")
    await asyncio.to_thread(command.downgrade, config, "0003")
    async with engine.connect() as connection:
        columns = await connection.run_sync(_columns, "members")
        assert {"stuck", "stuck_reported_at"}.isdisjoint(columns)
        assert "expires_at" in columns
    await asyncio.to_thread(command.downgrade, config, "0002")
    async with engine.connect() as connection:
        columns = await connection.run_sync(
            lambda sync: {c["name"] for c in inspect(sync).get_columns("groups")}
        )
        assert "members_left_at" not in columns
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


async def test_deleting_members_stamps_when_the_group_last_had_one(
    make_migrated_database: MakeDatabase,
) -> None:
    """Retention's clock (migration 0003's trigger) starts when members go, however they go,
    and only for their groups."""
    engine = create_async_engine(await make_migrated_database())
    member = (
        "INSERT INTO members (group_id, member_id, member_epoch, previous_member_epoch, "
        "subscribed_topics, allow_individual_commit, session_timeout_ms, expires_at) "
        "VALUES (:g, :m, 1, 1, '{t}', true, 1000, now())"
    )
    left_at = "SELECT group_id, members_left_at FROM groups ORDER BY group_id"
    async with engine.begin() as connection:
        await connection.execute(text("INSERT INTO groups (group_id) VALUES ('a'), ('b')"))
        for group_id, member_id in (("a", "m1"), ("a", "m2"), ("b", "m3")):
            await connection.execute(text(member), {"g": group_id, "m": member_id})
    async with engine.begin() as connection:
        assert [row[1] for row in await connection.execute(text(left_at))] == [None, None]
        await connection.execute(text("DELETE FROM members WHERE group_id = 'a'"))
        stamped = {row[0]: row[1] for row in await connection.execute(text(left_at))}
        assert stamped["a"] is not None and stamped["b"] is None
    await engine.dispose()


async def test_members_stored_before_stuck_calls_existed_report_none(
    make_migrated_database: MakeDatabase,
) -> None:
    """Migration 0004 gives rows of older members an empty report, not NULL: the admin API
    and the gauges read every live member's list."""
    engine = await member_stored_at(await make_migrated_database(), "0003")
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text("SELECT stuck, stuck_reported_at FROM members WHERE member_id = 'm-old'")
            )
        ).one()
        assert (row.stuck, row.stuck_reported_at) == ([], None)
    await engine.dispose()


async def test_members_stored_before_standbys_existed_report_none(
    make_migrated_database: MakeDatabase,
) -> None:
    """Migration 0006 gives rows of older members an empty list, not NULL: the assignor reads
    every member's standbys."""
    engine = await member_stored_at(await make_migrated_database(), "0005")
    async with engine.connect() as connection:
        row = (
            await connection.execute(text("SELECT standbys FROM members WHERE member_id = 'm-old'"))
        ).one()
        assert row.standbys == []
    await engine.dispose()


async def member_stored_at(url: str, revision: str) -> AsyncEngine:
    """An engine on ``url`` after a member row ('old', 'm-old') was stored at ``revision``
    and the schema upgraded to head: what a migration leaves in an older member's columns."""
    config = migrate.alembic_config(url)
    await asyncio.to_thread(command.downgrade, config, revision)
    engine = create_async_engine(url)
    async with engine.begin() as connection:
        await connection.execute(text("INSERT INTO groups (group_id) VALUES ('old')"))
        await connection.execute(
            text(
                "INSERT INTO members (group_id, member_id, member_epoch, previous_member_epoch, "
                "subscribed_topics, allow_individual_commit, session_timeout_ms, expires_at) "
                "VALUES ('old', 'm-old', 1, 0, '{t}', true, 1000, now())"
            )
        )
    await asyncio.to_thread(command.upgrade, config, "head")
    return engine
