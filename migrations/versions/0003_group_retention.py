"""Group retention: when a group last had a member, so groups idle for the retention are
deleted (offsets_retention_minutes, docs/quotas.md).

``groups.members_left_at`` is set by a trigger whenever member rows are deleted (a leave, an
expired session reaped, an admin removal, a static member replaced): every path that deletes
members is covered in one place, and every one of them already holds the group's row lock.
Groups that exist at upgrade start their retention clock then.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("groups", sa.Column("members_left_at", sa.DateTime(timezone=True)))
    op.execute("UPDATE groups SET members_left_at = now()")
    op.execute(
        """
        CREATE FUNCTION keyrange_members_left() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE groups SET members_left_at = now()
            WHERE group_id IN (SELECT DISTINCT group_id FROM gone);
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER members_left AFTER DELETE ON members
        REFERENCING OLD TABLE AS gone
        FOR EACH STATEMENT EXECUTE FUNCTION keyrange_members_left()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER members_left ON members")
    op.execute("DROP FUNCTION keyrange_members_left()")
    op.drop_column("groups", "members_left_at")
