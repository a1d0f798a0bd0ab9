"""Where standby key ranges go (``client.streams.standby_plan``): never on the owner, spread
over the members after it, the same on every member."""

from __future__ import annotations

from client.protocol.keyspace import KeyRange
from client.streams.standby_plan import OwnedRange, standby_ranges

HALVES = KeyRange.full().split(2)
THIRDS = KeyRange.full().split(3)


def owned(owners: list[str], ranges: list[KeyRange]) -> list[OwnedRange]:
    return [
        ("words", 0, keys.start, keys.end, owner)
        for owner, keys in zip(owners, ranges, strict=True)
    ]


def test_none_by_default_and_none_alone() -> None:
    group = owned(["a", "b"], HALVES)
    assert standby_ranges(group, "a", 0) == []
    assert standby_ranges(owned(["a"], [KeyRange.full()]), "a", 1) == []


def test_two_members_keep_each_others_range() -> None:
    group = owned(["a", "b"], HALVES)
    assert standby_ranges(group, "a", 1) == [("words", 0, HALVES[1])]
    assert standby_ranges(group, "b", 1) == [("words", 0, HALVES[0])]
    # More replicas than other members: every other member's range, once.
    assert standby_ranges(group, "a", 3) == [("words", 0, HALVES[1])]


def test_never_on_the_owner_and_spread_over_the_next_members() -> None:
    group = owned(["a", "b", "c"], THIRDS)
    placed = {member: standby_ranges(group, member, 1) for member in "abc"}
    # a's range on b, b's on c, c's on a: one standby each, none on its owner.
    assert placed == {
        "a": [("words", 0, THIRDS[2])],
        "b": [("words", 0, THIRDS[0])],
        "c": [("words", 0, THIRDS[1])],
    }
    two = {member: standby_ranges(group, member, 2) for member in "abc"}
    for member, index in zip("abc", range(3), strict=True):
        assert ("words", 0, THIRDS[index]) not in two[member]
        assert len(two[member]) == 2


def test_a_member_owning_nothing_keeps_no_standby() -> None:
    assert standby_ranges(owned(["a", "b"], HALVES), "idle", 1) == []


def test_a_range_per_partition_and_topic() -> None:
    full = KeyRange.full()
    group: list[OwnedRange] = [
        ("words", 0, HALVES[0].start, HALVES[0].end, "a"),
        ("words", 1, full.start, full.end, "b"),
        ("other", 0, HALVES[1].start, HALVES[1].end, "b"),
    ]
    assert standby_ranges(group, "a", 1) == [
        ("other", 0, HALVES[1]),
        ("words", 1, KeyRange.full()),
    ]
