"""SQL of stuck calls: what each member last reported of its user code still running on keys
of slices it was asked to give up (docs/api.md, "Stuck calls"). Reports ride on the member's
row, so they go with it (a leave, an expired session, an admin removal); reading them is
about live members only, like every other figure of a group's membership."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_SAVE = text(
    """
    UPDATE members SET stuck = CAST(:stuck AS jsonb), stuck_reported_at = now()
    WHERE group_id = :group_id AND member_id = :member_id
    """
)

# The report's age on the database's clock, which stamped it: replicas' clocks never enter.
# Every write stamps it; a row written by hand without the stamp counts from the member's
# last heartbeat.
_REPORTED_AT = "coalesce(m.stuck_reported_at, m.last_heartbeat)"

_READ_GROUP = text(
    f"""
    SELECT m.member_id, m.stuck, {_REPORTED_AT} AS reported_at,
           extract(epoch FROM now() - {_REPORTED_AT})::float8 AS age_s
    FROM members m
    WHERE m.group_id = :group_id AND m.expires_at > now() AND m.stuck <> '[]'::jsonb
    ORDER BY m.member_id
    """
)

# Per group with a stuck call: how many, and the longest running one, aged like the above.
_FIGURES = text(
    f"""
    SELECT m.group_id, count(*) AS calls,
           max((call->>'running_s')::float8
               + extract(epoch FROM now() - {_REPORTED_AT})::float8) AS longest_s
    FROM members m, LATERAL jsonb_array_elements(m.stuck) AS call
    WHERE m.expires_at > now()
    GROUP BY m.group_id
    """
)


@dataclass(frozen=True)
class StuckReport:
    """One member's last report: the calls as sent, when it was stored, how long ago."""

    calls: list[dict[str, Any]]
    reported_at: datetime
    age_s: float


@dataclass(frozen=True)
class StuckFigures:
    calls: int
    longest_s: float


async def save_stuck(
    connection: AsyncConnection, group_id: str, member_id: str, calls: Sequence[dict[str, Any]]
) -> None:
    """Replace the member's report, in the caller's transaction (its heartbeat's)."""
    await connection.execute(
        _SAVE, {"group_id": group_id, "member_id": member_id, "stuck": json.dumps(list(calls))}
    )


async def read_stuck(connection: AsyncConnection, group_id: str) -> dict[str, StuckReport]:
    """The reports of the group's live members that have stuck calls, by member id."""
    result = await connection.execute(_READ_GROUP, {"group_id": group_id})
    return {
        row.member_id: StuckReport(list(row.stuck), row.reported_at, max(0.0, row.age_s))
        for row in result
    }


async def stuck_figures(connection: AsyncConnection) -> dict[str, StuckFigures]:
    """For the gauges: each group whose live members report stuck calls."""
    result = await connection.execute(_FIGURES)
    return {
        row.group_id: StuckFigures(int(row.calls), max(0.0, float(row.longest_s))) for row in result
    }
