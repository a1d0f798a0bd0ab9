"""Assignors on hand-built groups: the proposal's and KIP-315's worked examples, exactly."""

from __future__ import annotations

import pytest

from client.protocol.keyspace import HASH_MAX, KeyRange
from coordinator.core.assignment import (
    GroupAssignment,
    GroupSpec,
    MemberSpec,
    Slice,
    TopicSpec,
    balance,
    member_loads,
    moved_fraction,
    moved_hash_count,
    slices_from_wire,
    slices_to_wire,
    subtract_slices,
)
from coordinator.core.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    RangeAssignor,
    RoundRobinAssignor,
    StickyJoinAssignor,
    UnknownAssignorError,
    get_assignor,
)

HALF = 2**62  # first hash of the upper half
THIRD = KeyRange.full().split(3)
LOWER, UPPER = KeyRange(0, HALF - 1), KeyRange(HALF, HASH_MAX)
WHOLE = KeyRange.full()


def members(*names: str, topics: frozenset[str], allow: bool = True) -> list[MemberSpec]:
    return [MemberSpec(name, topics, allow) for name in names]


def partitions_of(assignment: GroupAssignment) -> dict[str, list[tuple[str, int]]]:
    return {
        member: sorted({(piece.topic, piece.partition) for piece in slices})
        for member, slices in assignment.items()
    }


def numbers_of(assignment: GroupAssignment) -> dict[str, list[int]]:
    return {
        member: sorted({piece.partition for piece in slices})
        for member, slices in assignment.items()
    }


# The proposal's round-robin example: 5 members, one topic of 3 partitions.


def test_round_robin_splits_partitions_when_members_outnumber_them() -> None:
    group = GroupSpec.of(
        members("M1", "M2", "M3", "M4", "M5", topics=frozenset({"t"})), [TopicSpec("t", 3, True)]
    )

    assert RoundRobinAssignor().assign(group) == {
        "M1": (Slice("t", 0, LOWER),),
        "M2": (Slice("t", 1, LOWER),),
        "M3": (Slice("t", 2, WHOLE),),
        "M4": (Slice("t", 0, UPPER),),
        "M5": (Slice("t", 1, UPPER),),
    }


def test_round_robin_deals_whole_partitions_when_the_topic_refuses_range_fetch() -> None:
    group = GroupSpec.of(
        members("M1", "M2", "M3", "M4", "M5", topics=frozenset({"t"})), [TopicSpec("t", 3, False)]
    )

    assert RoundRobinAssignor().assign(group) == {
        "M1": (Slice.whole("t", 0),),
        "M2": (Slice.whole("t", 1),),
        "M3": (Slice.whole("t", 2),),
        "M4": (),
        "M5": (),
    }


def test_round_robin_deals_whole_partitions_when_the_coordinator_refuses_ic() -> None:
    group = GroupSpec.of(
        members("M1", "M2", "M3", topics=frozenset({"t"})),
        [TopicSpec("t", 2, True)],
        accept_individual_commit=False,
    )

    assert all(
        piece.is_whole for slices in RoundRobinAssignor().assign(group).values() for piece in slices
    )


def test_round_robin_carries_on_with_the_least_loaded_member_on_the_next_topic() -> None:
    group = GroupSpec.of(
        members("m1", "m2", topics=frozenset({"a", "b"})), [TopicSpec("a", 3), TopicSpec("b", 3)]
    )

    assert partitions_of(RoundRobinAssignor().assign(group)) == {
        "m1": [("a", 0), ("a", 2), ("b", 1)],
        "m2": [("a", 1), ("b", 0), ("b", 2)],
    }


def test_round_robin_gives_the_bigger_slices_of_the_next_topic_to_the_least_loaded() -> None:
    group = GroupSpec.of(
        members("M1", "M2", "M3", "M4", "M5", topics=frozenset({"a", "b"})),
        [TopicSpec("a", 3, True), TopicSpec("b", 3, True)],
    )

    loads = member_loads(RoundRobinAssignor().assign(group))

    # Plain per-topic dealing would give M3 two whole partitions and everyone else 1.0.
    assert max(loads.values()) - min(loads.values()) <= 0.5
    assert loads["M3"] == pytest.approx(1.5)


def test_whole_only_members_stand_by_while_sharers_outnumber_partitions() -> None:
    group = GroupSpec.of(
        [
            *members("s1", "s2", "s3", "s4", topics=frozenset({"t"})),
            *members("w1", topics=frozenset({"t"}), allow=False),
        ],
        [TopicSpec("t", 3, True)],
    )

    assignment = RoundRobinAssignor().assign(group)

    assert assignment["w1"] == ()
    assert partitions_of(assignment) == {
        "s1": [("t", 0)],
        "s2": [("t", 1)],
        "s3": [("t", 2)],
        "s4": [("t", 0)],
        "w1": [],
    }


def test_whole_only_members_get_whole_partitions_while_sharers_are_fewer_than_partitions() -> None:
    group = GroupSpec.of(
        [
            *members("s1", "s2", topics=frozenset({"t"})),
            *members("w1", "w2", topics=frozenset({"t"}), allow=False),
        ],
        [TopicSpec("t", 3, True)],
    )

    assignment = RoundRobinAssignor().assign(group)

    assert all(piece.is_whole for slices in assignment.values() for piece in slices)
    assert partitions_of(assignment) == {
        "s1": [("t", 0)],
        "s2": [("t", 1)],
        "w1": [("t", 2)],
        "w2": [],
    }


def test_static_members_keep_their_place_across_a_restart_under_a_new_member_id() -> None:
    def group(first_id: str) -> GroupSpec:
        return GroupSpec.of(
            [
                MemberSpec(first_id, frozenset({"t"}), instance_id="worker-1"),
                MemberSpec("m-a", frozenset({"t"}), instance_id="worker-2"),
            ],
            [TopicSpec("t", 4, True)],
        )

    before = RoundRobinAssignor().assign(group("m-z"))
    after = RoundRobinAssignor().assign(group("m-b"))

    assert before["m-z"] == after["m-b"] == (Slice.whole("t", 0), Slice.whole("t", 2))


# The proposal's range example: 5 members, topics of 2 and 3 partitions.


def test_range_puts_members_in_contiguous_blocks_per_partition() -> None:
    group = GroupSpec.of(
        members("c1", "c2", "c3", "c4", "c5", topics=frozenset({"t1", "t2"})),
        [TopicSpec("t1", 2, True), TopicSpec("t2", 3, True)],
    )

    assert RangeAssignor().assign(group) == {
        "c1": (Slice("t1", 0, THIRD[0]), Slice("t2", 0, LOWER)),
        "c2": (Slice("t1", 0, THIRD[1]), Slice("t2", 0, UPPER)),
        "c3": (Slice("t1", 0, THIRD[2]), Slice("t2", 1, LOWER)),
        "c4": (Slice("t1", 1, LOWER), Slice("t2", 1, UPPER)),
        "c5": (Slice("t1", 1, UPPER), Slice("t2", 2, WHOLE)),
    }


def test_range_gives_whole_partitions_in_blocks_as_kafka_does() -> None:
    group = GroupSpec.of(
        members("c1", "c2", "c3", topics=frozenset({"t"})), [TopicSpec("t", 7, True)]
    )

    assert partitions_of(RangeAssignor().assign(group)) == {
        "c1": [("t", 0), ("t", 1), ("t", 2)],
        "c2": [("t", 3), ("t", 4)],
        "c3": [("t", 5), ("t", 6)],
    }


# KIP-315: impressions and clicks, 10 partitions each.

JOIN = frozenset({"impressions", "clicks"})
JOIN_TOPICS = [TopicSpec("impressions", 10), TopicSpec("clicks", 10)]


def test_sticky_join_from_scratch_gives_the_kips_valid_assignment() -> None:
    group = GroupSpec.of(members("A", "B", "C", "D", topics=JOIN), JOIN_TOPICS)

    assignment = StickyJoinAssignor().assign(group)

    assert numbers_of(assignment) == {
        "A": [0, 1, 2],
        "B": [3, 4, 5],
        "C": [6, 7],
        "D": [8, 9],
    }
    for slices in assignment.values():
        assert {piece.topic for piece in slices} == JOIN


def test_sticky_join_moves_only_the_departed_members_partitions_when_d_leaves() -> None:
    previous = {"A": [0, 1, 2], "B": [3, 4, 5], "C": [6, 7]}
    group = GroupSpec.of(
        [
            MemberSpec(
                name,
                JOIN,
                owned=tuple(Slice.whole(topic, p) for topic in JOIN for p in numbers),
                member_epoch=5,
            )
            for name, numbers in previous.items()
        ],
        JOIN_TOPICS,
    )

    assert numbers_of(StickyJoinAssignor().assign(group)) == {
        "A": [0, 1, 2, 9],
        "B": [3, 4, 5],
        "C": [6, 7, 8],
    }


def test_sticky_join_gives_a_disputed_partition_to_the_higher_epoch() -> None:
    group = GroupSpec.of(
        [
            MemberSpec("A", JOIN, owned=(Slice.whole("clicks", 0),), member_epoch=3),
            MemberSpec("B", JOIN, owned=(Slice.whole("clicks", 0),), member_epoch=4),
        ],
        [TopicSpec("impressions", 2), TopicSpec("clicks", 2)],
    )

    assert numbers_of(StickyJoinAssignor().assign(group)) == {"A": [1], "B": [0]}


def test_sticky_join_only_assigns_partition_numbers_every_topic_has() -> None:
    group = GroupSpec.of(
        members("A", "B", topics=JOIN), [TopicSpec("impressions", 4), TopicSpec("clicks", 3)]
    )

    assert numbers_of(StickyJoinAssignor().assign(group)) == {"A": [0, 1], "B": [2]}


def test_sticky_join_splits_a_number_with_the_same_ranges_on_every_topic() -> None:
    topics = [TopicSpec("impressions", 2, True), TopicSpec("clicks", 2, True)]
    group = GroupSpec.of(members("A", "B", "C", topics=JOIN), topics)

    assignment = StickyJoinAssignor().assign(group)

    assert assignment == {
        "A": (Slice("clicks", 0, LOWER), Slice("impressions", 0, LOWER)),
        "B": (Slice("clicks", 0, UPPER), Slice("impressions", 0, UPPER)),
        "C": (Slice.whole("clicks", 1), Slice.whole("impressions", 1)),
    }


def test_sticky_join_keeps_whole_numbers_when_one_joined_topic_refuses_range_fetch() -> None:
    topics = [TopicSpec("impressions", 2, True), TopicSpec("clicks", 2, False)]
    group = GroupSpec.of(members("A", "B", "C", topics=JOIN), topics)

    assert numbers_of(StickyJoinAssignor().assign(group)) == {"A": [0], "B": [1], "C": []}


def test_sticky_join_joiner_takes_a_little_from_each_member_of_its_number() -> None:
    topics = [TopicSpec("impressions", 1, True), TopicSpec("clicks", 1, True)]
    before = StickyJoinAssignor().assign(GroupSpec.of(members("A", "B", topics=JOIN), topics))
    group = GroupSpec.of(
        [
            *(MemberSpec(name, JOIN, owned=before[name]) for name in ("A", "B")),
            MemberSpec("C", JOIN),
        ],
        topics,
    )

    after = StickyJoinAssignor().assign(group)

    # Three members cut the number into 64 tiles (22 + 21 + 21); A and B each keep the bottom
    # of their half and C takes what they give up. Fixed thirds would move a third of the
    # space *and* shift B's boundary.
    tile = 2**57
    a_kept, b_kept = KeyRange(0, 22 * tile - 1), KeyRange(32 * tile, 53 * tile - 1)
    c_ranges = [KeyRange(22 * tile, 32 * tile - 1), KeyRange(53 * tile, HASH_MAX)]
    assert after == {
        "A": (Slice("clicks", 0, a_kept), Slice("impressions", 0, a_kept)),
        "B": (Slice("clicks", 0, b_kept), Slice("impressions", 0, b_kept)),
        "C": tuple(
            Slice(topic, 0, keys) for topic in ("clicks", "impressions") for keys in c_ranges
        ),
    }
    assert moved_fraction(before, after) == 21 / 64


def test_sticky_join_members_that_keep_their_place_keep_their_ranges() -> None:
    topics = [TopicSpec("impressions", 2, True), TopicSpec("clicks", 2, True)]
    names = ("A", "B", "C", "D", "E")
    before = StickyJoinAssignor().assign(GroupSpec.of(members(*names, topics=JOIN), topics))
    staying = [MemberSpec(name, JOIN, owned=before[name]) for name in names if name != "C"]

    after = StickyJoinAssignor().assign(GroupSpec.of(staying, topics))

    assert numbers_of(before) == {"A": [0], "B": [0], "C": [0], "D": [1], "E": [1]}
    for name in ("A", "B", "D", "E"):
        assert subtract_slices(before[name], after[name]) == ()
    assert after["D"] == before["D"] and after["E"] == before["E"]
    assert moved_hash_count(before, after) == sum(piece.keys.size for piece in before["C"])


def test_sticky_join_leaves_a_topic_unassigned_where_the_number_holder_does_not_join_it() -> None:
    group = GroupSpec.of(
        [MemberSpec("A", JOIN), MemberSpec("B", frozenset({"impressions"}))],
        [TopicSpec("impressions", 2), TopicSpec("clicks", 2)],
    )

    assert partitions_of(StickyJoinAssignor().assign(group)) == {
        "A": [("clicks", 0), ("impressions", 0)],
        "B": [("impressions", 1)],
    }


def test_sticky_join_assigns_unrelated_subscriptions_independently() -> None:
    group = GroupSpec.of(
        [MemberSpec("A", frozenset({"x"})), MemberSpec("B", frozenset({"y"}))],
        [TopicSpec("x", 2), TopicSpec("y", 3)],
    )

    assert partitions_of(StickyJoinAssignor().assign(group)) == {
        "A": [("x", 0), ("x", 1)],
        "B": [("y", 0), ("y", 1), ("y", 2)],
    }


# Registry


def test_every_assignor_is_registered_under_its_wire_name() -> None:
    assert sorted(ASSIGNORS) == ["range", "round-robin", "sticky-join"]
    assert get_assignor(None).name == DEFAULT_ASSIGNOR == "round-robin"
    assert isinstance(get_assignor("sticky-join"), StickyJoinAssignor)


def test_an_unknown_assignor_name_is_a_key_error_that_lists_the_known_ones() -> None:
    with pytest.raises(KeyError) as raised:
        get_assignor("uniform")

    assert isinstance(raised.value, UnknownAssignorError)
    assert str(raised.value) == "unknown assignor 'uniform'; known: range, round-robin, sticky-join"


# Wire shape and quality measures


def test_slices_round_trip_through_the_wire_shape_one_entry_per_partition() -> None:
    slices = (Slice("t", 0, KeyRange(0, 9)), Slice("t", 0, KeyRange(20, 29)), Slice.whole("u", 3))

    wire = slices_to_wire(slices)

    assert wire == [
        {"topic": "t", "partition": 0, "ranges": [[0, 9], [20, 29]]},
        {"topic": "u", "partition": 3, "ranges": [[0, HASH_MAX]]},
    ]
    assert slices_from_wire(wire) == slices


def test_wire_slices_are_normalized_and_an_empty_range_list_means_the_whole_partition() -> None:
    wire = [
        {"topic": "t", "partition": 0, "ranges": [[10, 19], [0, 9]]},
        {"topic": "t", "partition": 1, "ranges": []},
    ]

    assert slices_from_wire(wire) == (Slice("t", 0, KeyRange(0, 19)), Slice.whole("t", 1))


@pytest.mark.parametrize(
    "entry",
    [
        {"topic": "", "partition": 0},
        {"topic": "t", "partition": -1},
        {"topic": "t", "partition": True},
        {"topic": "t", "partition": 0, "ranges": [[5, 1]]},
        {"topic": "t", "partition": 0, "ranges": [[0, 2**63]]},
        {"topic": "t", "partition": 0, "ranges": "all"},
    ],
)
def test_malformed_wire_slices_are_rejected(entry: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        slices_from_wire([entry])


def test_balance_compares_members_of_the_same_subscription_and_switch_only() -> None:
    group = GroupSpec.of(
        [
            MemberSpec("a1", frozenset({"t"})),
            MemberSpec("a2", frozenset({"t"})),
            MemberSpec("w", frozenset({"t"}), allow_individual_commit=False),
            MemberSpec("u", frozenset({"u"})),
        ],
        [TopicSpec("t", 1, True), TopicSpec("u", 4)],
    )
    assignment = {
        "a1": (Slice("t", 0, LOWER),),
        "a2": (Slice("t", 0, KeyRange(HALF, HALF + HALF // 2 - 1)),),
        "w": (),
        "u": tuple(Slice.whole("u", p) for p in range(4)),
    }

    assert member_loads(assignment) == {"a1": 0.5, "a2": 0.25, "w": 0.0, "u": 4.0}
    assert balance(assignment, group) == 0.25


def test_moved_counts_every_hash_whose_owner_changed() -> None:
    before = {"a": (Slice.whole("t", 0),), "b": (Slice.whole("t", 1),)}
    after = {"a": (Slice("t", 0, LOWER), Slice.whole("t", 1)), "c": (Slice("t", 0, UPPER),)}

    assert moved_hash_count(before, after) == 2**63 + 2**62
    assert moved_fraction(before, after) == 0.75
