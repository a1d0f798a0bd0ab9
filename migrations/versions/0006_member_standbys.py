"""Member standbys: the key ranges a member reports keeping warm copies of (a streams
instance's standby key ranges), which the sticky stream-join assignor prefers it for when
they move (docs/api.md, "Standby key ranges"; docs/streams.md, "Standby key ranges").

``members.standbys`` goes with the member row, so a leave or an expired session forgets it.
Rows that exist at upgrade report none, which is what their members (older clients) send.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "members",
        sa.Column(
            "standbys",
            postgresql.JSONB(),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
    )


def downgrade() -> None:
    op.drop_column("members", "standbys")
