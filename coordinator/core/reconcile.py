"""What each member may own *now*, on the way to its target (docs/design.md §5), key-range granular.

Shaped like Kafka's ``CurrentAssignmentBuilder``: the assignor computes targets freely, and
this step hands them out safely. A member *holds* what it last reported owning plus what it
was last told it may own (it may have started on that already). A member's new assignment is
its target minus everything any other member holds: revocations take effect at once (the
assignment shrinks), and a slice is granted only once its previous holder has been told to
give it up *and* has reported it released. Removing a member (leave, session expiry, admin
removal) simply drops its holding, which frees what it held.

Safety invariant: if the holdings of different members are disjoint and the targets are
disjoint, every new assignment is disjoint from every other member's holding, before and after
the member reports its smaller ``owned`` -- so at no instant do two members own overlapping
key ranges of a partition. Keeping also "the target's part of what the member itself holds"
would change nothing while holdings are disjoint (that part is free of others already); when a
broken client has made holdings overlap, this form asks both holders to let go instead of
confirming one of them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from client.protocol.keyspace import KeyRange, normalize, subtract
from coordinator.core.assignment import (
    GroupAssignment,
    Slice,
    TopicPartition,
    intersect_slices,
    normalize_slices,
    ranges_by_partition,
    slices_from_ranges,
    subtract_slices,
    union_slices,
)

MemberState = Literal["STABLE", "UNREVOKED", "UNRELEASED"]


@dataclass(frozen=True, slots=True)
class MemberHolding:
    """The coordinator's record of one member: ``owned`` as last reported by the member,
    ``assigned`` as last sent to it."""

    owned: tuple[Slice, ...] = ()
    assigned: tuple[Slice, ...] = ()
    member_epoch: int = 0

    @property
    def held(self) -> tuple[Slice, ...]:
        return union_slices(self.owned, self.assigned)


@dataclass(frozen=True, slots=True)
class MemberDecision:
    """``assigned`` is what the member may own now (normalized); ``member_epoch`` is bumped
    exactly when ``assigned`` changed. ``state``: ``UNREVOKED`` while the member still owns
    something outside ``assigned`` (it must finish, commit and report it released),
    ``UNRELEASED`` while part of its target is still held by another member, else ``STABLE``."""

    assigned: tuple[Slice, ...]
    member_epoch: int
    state: MemberState


def reconcile(
    members: Mapping[str, MemberHolding], targets: GroupAssignment
) -> dict[str, MemberDecision]:
    """Decide every member at once from the same holdings (a member with no target is asked
    to give everything up). Deciding them together is safe: new assignments lie within the
    disjoint targets and outside every other member's current holding."""
    index = _HeldIndex(members)
    decisions = {}
    for member_id, holding in members.items():
        wanted = ranges_by_partition(targets.get(member_id, ()))
        others = {tp: index.held_by_others(member_id, tp) for tp in wanted}
        decisions[member_id] = _decide(holding, wanted, others)
    return decisions


def reconcile_member(
    member_id: str, members: Mapping[str, MemberHolding], target: Iterable[Slice]
) -> MemberDecision:
    """Decide one member, as a heartbeat does; ``members`` must include it. One pass over the
    other members' slices, normalizing only the partitions the member is targeted on: a
    heartbeat of a 5,000-member group should not sort 5,000 holdings."""
    wanted = ranges_by_partition(target)
    others: dict[TopicPartition, list[KeyRange]] = {tp: [] for tp in wanted}
    for other_id, holding in members.items():
        if other_id == member_id:
            continue
        for slices in (holding.owned, holding.assigned):
            for piece in slices:
                bucket = others.get((piece.topic, piece.partition))
                if bucket is not None:
                    bucket.append(piece.keys)
    return _decide(members[member_id], wanted, others)


def accept_reported_owned(reported: Iterable[Slice], holding: MemberHolding) -> tuple[Slice, ...]:
    """What a member's report of ``owned`` may contain: only what it already held. A member
    that claims more (a bug, or a zombie replaying an old assignment) must not block others or
    overlap them, so the excess is ignored."""
    return intersect_slices(reported, holding.held)


def find_overlaps(holdings: Mapping[str, Iterable[Slice]]) -> list[tuple[str, str, Slice]]:
    """Pairs of members whose slices overlap, with the overlapping part; empty exactly when
    the holdings are disjoint. For assertions and diagnostics."""
    by_partition: dict[TopicPartition, list[tuple[KeyRange, str]]] = defaultdict(list)
    for member_id, slices in holdings.items():
        for tp, ranges in ranges_by_partition(slices).items():
            by_partition[tp].extend((keys, member_id) for keys in ranges)
    overlaps = []
    for (topic, partition), entries in sorted(by_partition.items()):
        entries.sort()
        reach_keys, reach_member = entries[0]
        for keys, member_id in entries[1:]:
            common = keys.intersection(reach_keys)
            if common is not None and member_id != reach_member:
                first, second = sorted((reach_member, member_id))
                overlaps.append((first, second, Slice(topic, partition, common)))
            if keys.end > reach_keys.end:
                reach_keys, reach_member = keys, member_id
    return overlaps


def _decide(
    holding: MemberHolding,
    target_ranges: Mapping[TopicPartition, list[KeyRange]],
    held_by_others: Mapping[TopicPartition, list[KeyRange]],
) -> MemberDecision:
    assigned = slices_from_ranges(
        {tp: subtract(ranges, held_by_others[tp]) for tp, ranges in target_ranges.items()}
    )
    changed = assigned != normalize_slices(holding.assigned)
    state: MemberState
    if subtract_slices(holding.owned, assigned):
        state = "UNREVOKED"
    elif assigned != slices_from_ranges(target_ranges):
        state = "UNRELEASED"
    else:
        state = "STABLE"
    return MemberDecision(assigned, holding.member_epoch + (1 if changed else 0), state)


class _HeldIndex:
    """Per partition, who holds which hashes. With disjoint holdings (the normal case) "held
    by others" is the union minus the member's own, one subtraction instead of one per
    member; partitions where holdings overlap take the slow, exact path."""

    def __init__(self, members: Mapping[str, MemberHolding]) -> None:
        self._by_member: dict[str, dict[TopicPartition, list[KeyRange]]] = {}
        holders: dict[TopicPartition, list[tuple[str, list[KeyRange]]]] = defaultdict(list)
        for member_id, holding in members.items():
            held = ranges_by_partition((*holding.owned, *holding.assigned))
            self._by_member[member_id] = held
            for tp, ranges in held.items():
                holders[tp].append((member_id, ranges))
        self._holders = holders
        self._union: dict[TopicPartition, list[KeyRange]] = {}
        self._overlapping: set[TopicPartition] = set()
        for tp, entries in holders.items():
            every = [keys for _, ranges in entries for keys in ranges]
            union = normalize(every)
            self._union[tp] = union
            if sum(keys.size for keys in union) != sum(keys.size for keys in every):
                self._overlapping.add(tp)

    def held_by_others(self, member_id: str, tp: TopicPartition) -> list[KeyRange]:
        if tp in self._overlapping:
            return normalize(
                keys
                for holder, ranges in self._holders[tp]
                if holder != member_id
                for keys in ranges
            )
        return subtract(self._union.get(tp, ()), self._by_member.get(member_id, {}).get(tp, ()))
