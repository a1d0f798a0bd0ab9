"""Stuck calls: what each member last reported of its user code still running on keys of
slices it was asked to give up (docs/api.md, "Stuck calls"; docs/design.md §5, "Release
means nothing of it runs").

``members.stuck`` holds the list as the member's last heartbeat that carried it sent it, and
``members.stuck_reported_at`` when that heartbeat was stored, so the admin API can say how old
the report is. Both go with the member row: a leave or an expired session clears them. Rows
that exist at upgrade start with nothing stuck, which is what their members (older clients)
could report anyway.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "members",
        sa.Column(
            "stuck",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
    )
    op.add_column("members", sa.Column("stuck_reported_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("members", "stuck_reported_at")
    op.drop_column("members", "stuck")
