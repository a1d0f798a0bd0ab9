"""The sticky stream-join assignor's preference for members holding warm standbys: exact
cases first, then the invariant that standbys only choose among what balance and stickiness
leave open."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from client.protocol.keyspace import KeyRange, normalize, subtract
from coordinator.core.assignment import (
    GroupAssignment,
    GroupSpec,
    MemberSpec,
    Slice,
    TopicSpec,
    hash_count,
    intersect_slices,
    member_loads,
    moved_hash_count,
    subtract_slices,
)
from coordinator.core.assignors import StickyJoinAssignor
from tests.core.test_assignors_properties import assert_sticky_join_complete, groups

JOIN = frozenset({"impressions", "clicks"})


def numbers_of(assignment: GroupAssignment) -> dict[str, list[int]]:
    return {
        member: sorted({piece.partition for piece in slices})
        for member, slices in assignment.items()
    }


def holding(
    numbers: dict[str, list[int]], standbys: dict[str, list[int]] | None = None
) -> list[MemberSpec]:
    """Members owning whole ``numbers`` of both joined topics, with standbys of whole
    numbers of one of them (a report names any topic of the set)."""
    standbys = standbys or {}
    return [
        MemberSpec(
            name,
            JOIN,
            owned=tuple(Slice.whole(topic, p) for topic in sorted(JOIN) for p in owned),
            member_epoch=5,
            standbys=tuple(Slice.whole("clicks", p) for p in standbys.get(name, [])),
        )
        for name, owned in numbers.items()
    ]


def test_a_dead_members_number_goes_to_its_standby_holder_not_to_the_lowest_id() -> None:
    topics = [TopicSpec("impressions", 3), TopicSpec("clicks", 3)]
    survivors = {"A": [0], "C": [2]}  # B, holding number 1, died

    cold = StickyJoinAssignor().assign(GroupSpec.of(holding(survivors), topics))
    warm = StickyJoinAssignor().assign(
        GroupSpec.of(holding(survivors, {"A": [2], "C": [1]}), topics)
    )

    assert numbers_of(cold) == {"A": [0, 1], "C": [2]}
    assert numbers_of(warm) == {"A": [0], "C": [1, 2]}


def test_the_standby_holder_takes_as_many_of_the_leavers_numbers_as_balance_allows() -> None:
    # KIP-315's table: D (8, 9) leaves; without standbys C takes 8 and A takes 9.
    topics = [TopicSpec("impressions", 10), TopicSpec("clicks", 10)]
    previous = {"A": [0, 1, 2], "B": [3, 4, 5], "C": [6, 7]}

    cold = StickyJoinAssignor().assign(GroupSpec.of(holding(previous), topics))
    warm = StickyJoinAssignor().assign(GroupSpec.of(holding(previous, {"B": [8, 9]}), topics))

    assert numbers_of(cold) == {"A": [0, 1, 2, 9], "B": [3, 4, 5], "C": [6, 7, 8]}
    # B may take one more (4, 3, 3); the other goes as before, to the member with room.
    assert numbers_of(warm) == {"A": [0, 1, 2], "B": [3, 4, 5, 8], "C": [6, 7, 9]}


def test_standbys_never_pull_a_number_from_its_owner() -> None:
    topics = [TopicSpec("impressions", 2), TopicSpec("clicks", 2)]
    previous = {"A": [0], "B": [1]}

    warm = StickyJoinAssignor().assign(
        GroupSpec.of(holding(previous, {"A": [1], "B": [0]}), topics)
    )

    assert numbers_of(warm) == previous


def test_on_a_shared_partition_the_standby_holder_gets_the_larger_share_of_the_orphan() -> None:
    words = frozenset({"words"})
    topics = [TopicSpec("words", 1, True)]
    first = StickyJoinAssignor().assign(
        GroupSpec.of([MemberSpec(name, words) for name in "ABCD"], topics)
    )
    dead = first["B"]  # D keeps standbys of B's range

    def survivors(standbys: tuple[Slice, ...]) -> GroupSpec:
        return GroupSpec.of(
            [
                MemberSpec(name, words, owned=first[name], standbys=standbys if name == "D" else ())
                for name in "ACD"
            ],
            topics,
        )

    cold = StickyJoinAssignor().assign(survivors(()))
    warm = StickyJoinAssignor().assign(survivors(dead))

    # Four equal shares, three members: one gets a tile more, by default the first (A).
    cold_gain = subtract_slices(cold["D"], first["D"])
    warm_gain = subtract_slices(warm["D"], first["D"])
    assert hash_count(warm_gain) > hash_count(cold_gain) > 0
    assert hash_count(warm["D"]) == max(hash_count(slices) for slices in warm.values())
    assert intersect_slices(warm_gain, dead) == warm_gain
    assert sorted(member_loads(warm).values()) == sorted(member_loads(cold).values())
    assert moved_hash_count(first, warm) == moved_hash_count(first, cold) == hash_count(dead)


@st.composite
def standbys_after_a_leave(
    draw: st.DrawFn,
) -> tuple[GroupSpec, GroupAssignment, list[MemberSpec], dict[str, tuple[Slice, ...]]]:
    """A group's assignment, a leaver, and standbys on the survivors: pieces of what the
    leaver owned, and of what others own, in ranges that need not fit the assignment."""
    group = draw(groups(same_subscription=True))
    before = StickyJoinAssignor().assign(group)
    members = list(group.members.values())
    leaver = draw(st.sampled_from(members))
    staying = [member for member in members if member is not leaver]
    pieces = sorted({piece for slices in before.values() for piece in slices})
    standbys: dict[str, tuple[Slice, ...]] = {}
    for member in staying:
        chosen = draw(st.lists(st.sampled_from(pieces), max_size=4)) if pieces else []
        cut = draw(st.integers(0, 2**62))
        standbys[member.member_id] = tuple(
            Slice(piece.topic, piece.partition, keys)
            for piece in chosen
            for keys in normalize(
                subtract([piece.keys], [KeyRange(piece.keys.start, piece.keys.start + cut)])
                if draw(st.booleans()) and cut < piece.keys.size - 1
                else [piece.keys]
            )
        )
    return group, before, staying, standbys


def survivors_of(
    group: GroupSpec,
    before: GroupAssignment,
    staying: list[MemberSpec],
    standbys: dict[str, tuple[Slice, ...]],
) -> GroupSpec:
    return GroupSpec.of(
        [
            MemberSpec(
                member.member_id,
                member.subscribed_topics,
                member.allow_individual_commit,
                owned=before[member.member_id],
                standbys=standbys.get(member.member_id, ()),
            )
            for member in staying
        ],
        group.topics.values(),
        accept_individual_commit=group.accept_individual_commit,
    )


@given(case=standbys_after_a_leave())
@settings(max_examples=300, deadline=None)
def test_standbys_change_neither_balance_nor_how_much_moves(
    case: tuple[GroupSpec, GroupAssignment, list[MemberSpec], dict[str, tuple[Slice, ...]]],
) -> None:
    group, before, staying, standbys = case
    if not staying:
        return
    assignor = StickyJoinAssignor()
    cold_group = survivors_of(group, before, staying, {})
    warm_group = survivors_of(group, before, staying, standbys)

    cold, warm = assignor.assign(cold_group), assignor.assign(warm_group)

    assert_sticky_join_complete(warm_group, warm)
    assert moved_hash_count(before, warm) == moved_hash_count(before, cold)
    assert sorted(member_loads(warm).values()) == sorted(member_loads(cold).values())
    # Deterministic, and stable once the standbys' holders took what they got.
    assert assignor.assign(warm_group) == warm


@given(group=groups(same_subscription=True))
@settings(max_examples=150, deadline=None)
def test_standbys_of_nothing_the_set_assigns_change_nothing(group: GroupSpec) -> None:
    unrelated = (Slice.whole("elsewhere", 0), Slice.whole("a", 99))
    with_standbys = GroupSpec.of(
        [
            MemberSpec(
                member.member_id,
                member.subscribed_topics,
                member.allow_individual_commit,
                standbys=unrelated,
            )
            for member in group.members.values()
        ],
        group.topics.values(),
        accept_individual_commit=group.accept_individual_commit,
    )

    assert StickyJoinAssignor().assign(with_standbys) == StickyJoinAssignor().assign(group)
