"""SQL of member endpoints: where each member serves queries, as it advertised it (docs/api.md,
"Member endpoints"). The address rides on the member's row, so it goes with it (a leave, an
expired session, an admin removal), and the step never reads it."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_SAVE = text(
    """
    UPDATE members SET endpoint = :endpoint
    WHERE group_id = :group_id AND member_id = :member_id
    """
)

_READ_GROUP = text(
    """
    SELECT member_id, endpoint FROM members
    WHERE group_id = :group_id AND expires_at > now() AND endpoint IS NOT NULL
    """
)


async def save_endpoint(
    connection: AsyncConnection, group_id: str, member_id: str, endpoint: str
) -> None:
    """Replace the member's address, in the caller's transaction (its heartbeat's)."""
    await connection.execute(
        _SAVE, {"group_id": group_id, "member_id": member_id, "endpoint": endpoint}
    )


async def read_endpoints(connection: AsyncConnection, group_id: str) -> dict[str, str]:
    """The addresses of the group's live members that advertised one, by member id."""
    result = await connection.execute(_READ_GROUP, {"group_id": group_id})
    return {row.member_id: row.endpoint for row in result}
