"""Offset store: groups, per-partition stable offsets, IC ranges and watermarks, switches.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "groups",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_groups")),
    )
    op.create_table(
        "partition_offsets",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("stable_offset", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "ic_ranges",
            postgresql.INT8MULTIRANGE(),
            server_default=sa.text("'{}'::int8multirange"),
            nullable=False,
        ),
        sa.Column(
            "wm_starts",
            postgresql.ARRAY(sa.BigInteger()),
            server_default=sa.text("'{}'::bigint[]"),
            nullable=False,
        ),
        sa.Column(
            "wm_ends",
            postgresql.ARRAY(sa.BigInteger()),
            server_default=sa.text("'{}'::bigint[]"),
            nullable=False,
        ),
        sa.Column(
            "wm_offsets",
            postgresql.ARRAY(sa.BigInteger()),
            server_default=sa.text("'{}'::bigint[]"),
            nullable=False,
        ),
        sa.Column("metadata", sa.Text(), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "stable_offset >= 0", name=op.f("ck_partition_offsets_stable_offset_non_negative")
        ),
        sa.CheckConstraint(
            "cardinality(wm_starts) = cardinality(wm_ends) "
            "AND cardinality(wm_ends) = cardinality(wm_offsets)",
            name=op.f("ck_partition_offsets_watermark_arrays_aligned"),
        ),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["groups.group_id"],
            name=op.f("fk_partition_offsets_group_id_groups"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "group_id", "topic", "partition", name=op.f("pk_partition_offsets")
        ),
    )
    op.create_table(
        "topic_config",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("accept_range_fetch", sa.Boolean(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("topic", name=op.f("pk_topic_config")),
    )
    op.create_table(
        "coordinator_config",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("accept_individual_commit", sa.Boolean(), nullable=False),
        sa.Column("default_accept_range_fetch", sa.Boolean(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("id = 1", name=op.f("ck_coordinator_config_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_coordinator_config")),
    )


def downgrade() -> None:
    op.drop_table("coordinator_config")
    op.drop_table("topic_config")
    op.drop_table("partition_offsets")
    op.drop_table("groups")
