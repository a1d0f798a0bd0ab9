"""The notice a group change travels in between replicas."""

from __future__ import annotations

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


def test_a_notice_this_version_cannot_read_wakes_nobody() -> None:
    assert decode_change('{"group": "orders"}') is None
    assert decode_change("not json") is None
