"""The coordinator-wide switches, read in one place.

``accept.individual.commit`` and the default ``accept.range.fetch`` are stored in the single
row of ``coordinator_config`` (seeded from the settings at start-up, changed through the admin
API); until that row exists, the settings' values stand in. The commit batches read the
stored switch inside their fence statements, to save a round trip per batch: they embed
``STORED_SWITCH`` and resolve what it returns with :func:`accept_individual_commit`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.db.models import CoordinatorConfig
from coordinator.settings import Settings

STORED_SWITCH = "SELECT accept_individual_commit FROM coordinator_config WHERE id = 1"


@dataclass(frozen=True)
class Switches:
    accept_individual_commit: bool
    default_accept_range_fetch: bool


def accept_individual_commit(stored: bool | None, settings: Settings) -> bool:
    return settings.accept_individual_commit if stored is None else stored


async def read_switches(connection: AsyncConnection, settings: Settings) -> Switches:
    row = (
        await connection.execute(
            select(
                CoordinatorConfig.accept_individual_commit,
                CoordinatorConfig.default_accept_range_fetch,
            ).where(CoordinatorConfig.id == 1)
        )
    ).one_or_none()
    if row is None:
        return Switches(settings.accept_individual_commit, settings.default_accept_range_fetch)
    return Switches(bool(row[0]), bool(row[1]))
