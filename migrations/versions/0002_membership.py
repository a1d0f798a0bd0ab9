"""Membership: members with owned/assigned/target slices, group epochs, topic metadata.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("groups", sa.Column("assignor", sa.Text(), nullable=True))
    op.add_column(
        "groups", sa.Column("group_epoch", sa.BigInteger(), server_default="0", nullable=False)
    )
    op.add_column(
        "groups",
        sa.Column(
            "rebalance_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
    )
    op.add_column("groups", sa.Column("rebalance_reason", sa.Text(), nullable=True))
    slices = postgresql.JSONB(astext_type=sa.Text())
    op.create_table(
        "members",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("member_id", sa.Text(), nullable=False),
        sa.Column("instance_id", sa.Text(), nullable=True),
        sa.Column("client_id", sa.Text(), nullable=True),
        sa.Column("client_host", sa.Text(), nullable=True),
        sa.Column("member_epoch", sa.Integer(), nullable=False),
        sa.Column("previous_member_epoch", sa.Integer(), nullable=False),
        sa.Column("subscribed_topics", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("subscribed_topic_regex", sa.Text(), nullable=True),
        sa.Column("assignor", sa.Text(), nullable=True),
        sa.Column("allow_individual_commit", sa.Boolean(), nullable=False),
        sa.Column("session_timeout_ms", sa.Integer(), nullable=False),
        sa.Column("owned", slices, server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("assigned", slices, server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("target", slices, server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column(
            "joined_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "last_heartbeat",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["groups.group_id"],
            name=op.f("fk_members_group_id_groups"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("group_id", "member_id", name=op.f("pk_members")),
    )
    op.create_index("ix_members_expires_at", "members", ["expires_at"], unique=False)
    op.create_index(
        "uq_members_group_id_instance_id",
        "members",
        ["group_id", "instance_id"],
        unique=True,
        postgresql_where=sa.text("instance_id IS NOT NULL"),
    )
    op.create_table(
        "topic_metadata",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition_count", sa.Integer(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("topic", name=op.f("pk_topic_metadata")),
    )


def downgrade() -> None:
    op.drop_table("topic_metadata")
    op.drop_index("uq_members_group_id_instance_id", table_name="members")
    op.drop_index("ix_members_expires_at", table_name="members")
    op.drop_table("members")
    op.drop_column("groups", "rebalance_reason")
    op.drop_column("groups", "rebalance_requested")
    op.drop_column("groups", "group_epoch")
    op.drop_column("groups", "assignor")
