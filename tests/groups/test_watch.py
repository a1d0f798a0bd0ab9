"""The notice a group change travels in between replicas."""

from __future__ import annotations

from client.protocol.keyspace import KeyRange
from coordinator.core.assignment import Slice
from coordinator.core.handoff import GroupChange
from coordinator.groups.watch import decode_change, encode_change


def test_a_change_survives_the_notice() -> None:
    change = GroupChange("orders", frozenset({"m-1", "m-2"}), released=True, by="m-3")
    assert decode_change(encode_change(change)) == change


def test_a_change_naming_more_members_than_a_notice_holds_concerns_every_member() -> None:
    many = frozenset(f"m-{index:040d}" for index in range(1_000))
    change = GroupChange("orders", many, released=False, by="m-x")

    payload = encode_change(change)

    assert len(payload.encode()) < 8_000
    assert decode_change(payload) == GroupChange("orders", None, released=False, by="m-x")


def test_the_released_space_survives_the_notice() -> None:
    lower, _ = KeyRange.full().split(2)
    released = (Slice("orders", 0, lower), Slice.whole("orders", 3))
    change = GroupChange("orders", frozenset(), released=True, by="m-3", released_space=released)
    assert decode_change(encode_change(change)) == change


def test_a_released_space_too_large_for_a_notice_concerns_every_member_short() -> None:
    released = tuple(Slice.whole(f"topic-{index:040d}", 0) for index in range(1_000))
    change = GroupChange("orders", frozenset({"m-1"}), released=True, released_space=released)

    payload = encode_change(change)

    assert len(payload.encode()) < 8_000
    assert decode_change(payload) == GroupChange("orders", frozenset({"m-1"}), released=True)


def test_an_older_replica_s_release_concerns_every_member_short() -> None:
    older = '{"g":"orders","m":[],"r":true,"by":"m-3"}'
    assert decode_change(older) == GroupChange("orders", frozenset(), released=True, by="m-3")


def test_a_notice_this_version_cannot_read_wakes_nobody() -> None:
    assert decode_change('{"group": "orders"}') is None
    assert decode_change("not json") is None
