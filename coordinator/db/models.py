"""Tables of the coordinator. Alembic owns the schema; these models mirror it so that the
autogenerate check in the tests proves the two agree."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, INT8MULTIRANGE, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names, so later migrations can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Group(Base):
    __tablename__ = "groups"

    group_id: Mapped[str] = mapped_column(Text, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
    assignor: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Bumped whenever the target assignment is recomputed.
    group_epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # Set by a commit that hit max IC ranges, an admin, or a partition-count change.
    rebalance_requested: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=text("false")
    )
    rebalance_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # When member rows were last deleted; set by the members_left trigger (migration 0003)
    # and read by offset retention.
    members_left_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class PartitionOffsets(Base):
    """Committed progress of one group on one partition: stable offset, IC ranges and
    key-range watermark pieces (parallel arrays, sorted by hash start)."""

    __tablename__ = "partition_offsets"
    __table_args__ = (
        CheckConstraint("stable_offset >= 0", name="stable_offset_non_negative"),
        CheckConstraint(
            "cardinality(wm_starts) = cardinality(wm_ends) "
            "AND cardinality(wm_ends) = cardinality(wm_offsets)",
            name="watermark_arrays_aligned",
        ),
    )

    group_id: Mapped[str] = mapped_column(
        Text, ForeignKey("groups.group_id", ondelete="CASCADE"), primary_key=True
    )
    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    stable_offset: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    ic_ranges: Mapped[object] = mapped_column(
        INT8MULTIRANGE, nullable=False, server_default=text("'{}'::int8multirange")
    )
    wm_starts: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), nullable=False, server_default=text("'{}'::bigint[]")
    )
    wm_ends: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), nullable=False, server_default=text("'{}'::bigint[]")
    )
    wm_offsets: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), nullable=False, server_default=text("'{}'::bigint[]")
    )
    metadata_text: Mapped[str | None] = mapped_column("metadata", Text, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )


class TopicConfig(Base):
    __tablename__ = "topic_config"

    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    accept_range_fetch: Mapped[bool] = mapped_column(Boolean, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )


class CoordinatorConfig(Base):
    """The coordinator-wide switches: one row, so every replica reads the same values."""

    __tablename__ = "coordinator_config"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    accept_individual_commit: Mapped[bool] = mapped_column(Boolean, nullable=False)
    default_accept_range_fetch: Mapped[bool] = mapped_column(Boolean, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )


class Member(Base):
    """A live member. Slices are stored in the wire form of docs/api.md:
    ``[{"topic", "partition", "ranges": [[start, end], ...]}]``."""

    __tablename__ = "members"
    __table_args__ = (
        Index("ix_members_expires_at", "expires_at"),
        Index(
            "uq_members_group_id_instance_id",
            "group_id",
            "instance_id",
            unique=True,
            postgresql_where=text("instance_id IS NOT NULL"),
        ),
    )

    group_id: Mapped[str] = mapped_column(
        Text, ForeignKey("groups.group_id", ondelete="CASCADE"), primary_key=True
    )
    member_id: Mapped[str] = mapped_column(Text, primary_key=True)
    instance_id: Mapped[str | None] = mapped_column(Text, nullable=True)
    client_id: Mapped[str | None] = mapped_column(Text, nullable=True)
    client_host: Mapped[str | None] = mapped_column(Text, nullable=True)
    member_epoch: Mapped[int] = mapped_column(Integer, nullable=False)
    previous_member_epoch: Mapped[int] = mapped_column(Integer, nullable=False)
    subscribed_topics: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    subscribed_topic_regex: Mapped[str | None] = mapped_column(Text, nullable=True)
    assignor: Mapped[str | None] = mapped_column(Text, nullable=True)
    allow_individual_commit: Mapped[bool] = mapped_column(Boolean, nullable=False)
    session_timeout_ms: Mapped[int] = mapped_column(Integer, nullable=False)
    owned: Mapped[list[dict[str, object]]] = mapped_column(
        JSONB, nullable=False, server_default=text("'[]'::jsonb")
    )
    assigned: Mapped[list[dict[str, object]]] = mapped_column(
        JSONB, nullable=False, server_default=text("'[]'::jsonb")
    )
    target: Mapped[list[dict[str, object]]] = mapped_column(
        JSONB, nullable=False, server_default=text("'[]'::jsonb")
    )
    joined_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
    last_heartbeat: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # Calls of the member's user code still running on keys of slices it was asked to give
    # up, as its last heartbeat carrying them reported (docs/api.md, "Stuck calls"), and when
    # that heartbeat was stored.
    stuck: Mapped[list[dict[str, object]]] = mapped_column(
        JSONB, nullable=False, server_default=text("'[]'::jsonb")
    )
    stuck_reported_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    # Where the member serves queries (a streams instance's HTTP address), as it advertised
    # it when it joined; None when it serves none.
    endpoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The key ranges the member last reported keeping warm standbys of, which the sticky
    # stream-join assignor prefers it for when they move (docs/api.md, "Standby key ranges").
    standbys: Mapped[list[dict[str, object]]] = mapped_column(
        JSONB, nullable=False, server_default=text("'[]'::jsonb")
    )


class TopicMetadata(Base):
    """Partition counts read from Kafka, so a heartbeat assigns without calling Kafka inside
    its transaction and every replica assigns from the same numbers."""

    __tablename__ = "topic_metadata"

    topic: Mapped[str] = mapped_column(Text, primary_key=True)
    partition_count: Mapped[int] = mapped_column(Integer, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), nullable=False
    )
