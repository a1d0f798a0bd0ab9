"""Member endpoints: the address a member serves queries on, as it advertised it when it
joined (Kafka Streams' ``application.server``; docs/api.md, "Member endpoints";
docs/streams.md, "Queries over HTTP").

``members.endpoint`` goes with the member row, so a leave or an expired session forgets it.
Rows that exist at upgrade have none, which is what their members (older clients) could
advertise anyway.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("members", sa.Column("endpoint", sa.Text()))


def downgrade() -> None:
    op.drop_column("members", "endpoint")
