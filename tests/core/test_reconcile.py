"""The safe hand-off: scenarios by hand, then a randomized rebalance simulation that checks
the safety invariant (docs/design.md §5) at every step and convergence after the last change."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.protocol.keyspace import HASH_MAX, KeyRange
from coordinator.core.assignment import (
    GroupSpec,
    MemberSpec,
    Slice,
    TopicSpec,
    normalize_slices,
    subtract_slices,
    union_slices,
)
from coordinator.core.assignors import ASSIGNORS, Assignor
from coordinator.core.reconcile import (
    MemberDecision,
    MemberHolding,
    accept_reported_owned,
    find_overlaps,
    reconcile,
    reconcile_member,
)

HALF = 2**62
LOWER = Slice("t", 0, KeyRange(0, HALF - 1))
UPPER = Slice("t", 0, KeyRange(HALF, HASH_MAX))
P0, P1 = Slice.whole("t", 0), Slice.whole("t", 1)


def test_a_moved_partition_is_revoked_at_once_and_granted_only_after_release() -> None:
    targets = {"a": (), "b": (P0,)}
    holdings = {"a": MemberHolding((P0,), (P0,), 3), "b": MemberHolding((), (), 1)}

    told = reconcile(holdings, targets)

    assert told == {
        "a": MemberDecision((), 4, "UNREVOKED"),
        "b": MemberDecision((), 1, "UNRELEASED"),
    }
    # a has been told but still works on P0 until it reports otherwise.
    holdings["a"] = MemberHolding((P0,), (), 4)
    assert reconcile_member("b", holdings, targets["b"]) == MemberDecision((), 1, "UNRELEASED")

    holdings["a"] = MemberHolding((), (), 4)
    assert reconcile(holdings, targets) == {
        "a": MemberDecision((), 4, "STABLE"),
        "b": MemberDecision((P0,), 2, "STABLE"),
    }


def test_a_shared_partition_is_handed_over_key_range_by_key_range() -> None:
    targets = {"a": (LOWER,), "b": (UPPER,)}
    holdings = {"a": MemberHolding((P0,), (P0,), 1), "b": MemberHolding((), (), 0)}

    decisions = reconcile(holdings, targets)

    assert decisions["a"] == MemberDecision((LOWER,), 2, "UNREVOKED")
    assert decisions["b"] == MemberDecision((), 0, "UNRELEASED")

    holdings = {"a": MemberHolding((LOWER,), (LOWER,), 2), "b": MemberHolding((), (), 0)}
    assert reconcile_member("b", holdings, targets["b"]) == MemberDecision((UPPER,), 1, "STABLE")


def test_a_part_of_the_target_that_is_free_is_granted_while_the_rest_waits() -> None:
    targets = {"b": (P0, P1)}
    holdings = {"a": MemberHolding((P1,), (), 2), "b": MemberHolding((), (), 0)}

    assert reconcile_member("b", holdings, targets["b"]) == MemberDecision((P0,), 1, "UNRELEASED")


def test_removing_a_member_frees_what_it_held() -> None:
    holdings = {"a": MemberHolding((P0,), (P0,), 1), "b": MemberHolding((), (), 0)}
    del holdings["a"]

    assert reconcile(holdings, {"b": (P0,)}) == {"b": MemberDecision((P0,), 1, "STABLE")}


def test_the_epoch_is_bumped_only_when_the_assignment_changes() -> None:
    holdings = {"a": MemberHolding((P0,), (P0, P1), 7)}

    assert reconcile_member("a", holdings, (P1, P0)) == MemberDecision((P0, P1), 7, "STABLE")


def test_a_member_reporting_more_than_it_held_is_believed_only_for_what_it_held() -> None:
    holding = MemberHolding((LOWER,), (P1,), 2)

    assert accept_reported_owned((P0, P1, Slice.whole("u", 0)), holding) == (LOWER, P1)


def test_overlapping_holdings_make_both_holders_let_go() -> None:
    holdings = {"a": MemberHolding((P0,), (P0,), 1), "b": MemberHolding((LOWER,), (), 1)}

    decisions = reconcile(holdings, {"a": (P0,), "b": ()})

    assert decisions["a"] == MemberDecision((UPPER,), 2, "UNREVOKED")
    assert find_overlaps({m: h.owned for m, h in holdings.items()}) == [("a", "b", LOWER)]


def test_find_overlaps_sees_an_overlap_behind_a_long_range() -> None:
    holdings = {
        "a": (Slice("t", 0, KeyRange(0, 100)),),
        "b": (Slice("t", 0, KeyRange(10, 20)),),
        "c": (Slice("t", 0, KeyRange(30, 40)),),
    }

    assert find_overlaps(holdings) == [
        ("a", "b", Slice("t", 0, KeyRange(10, 20))),
        ("a", "c", Slice("t", 0, KeyRange(30, 40))),
    ]
    assert find_overlaps({"a": holdings["a"], "d": (Slice("t", 1, KeyRange(0, 100)),)}) == []


# The simulation: a coordinator that reconciles at each heartbeat, members that start new
# slices at once and report released ones a heartbeat (sometimes two) after being told.

MAX_HEARTBEAT_GAP = 3  # rounds between two heartbeats of a member, at most
SESSION_ROUNDS = 5  # a silent member expires after this many rounds
# Revoker told (1 gap), releases (up to 2 more), grantee told (1), grantee reports (1).
CONVERGENCE_ROUNDS = 5 * MAX_HEARTBEAT_GAP
SUBSCRIPTIONS = (frozenset({"a"}), frozenset({"a", "b"}), frozenset({"b"}))


@dataclass
class Worker:
    """The member process: what it really works on, which may exceed what it reported."""

    spec: MemberSpec
    working_on: tuple[Slice, ...] = ()
    next_heartbeat: int = 0
    silent_since: int | None = None
    delayed_release: bool = False


class Simulation:
    def __init__(self, assignor: Assignor, rng: random.Random) -> None:
        self.assignor = assignor
        self.rng = rng
        self.topics = {
            "a": TopicSpec("a", rng.randint(1, 3), True),
            "b": TopicSpec("b", rng.randint(1, 3), rng.random() < 0.7),
        }
        self.same_subscription = rng.random() < 0.5
        self.workers: dict[str, Worker] = {}
        self.holdings: dict[str, MemberHolding] = {}
        self.targets: dict[str, tuple[Slice, ...]] = {}
        self.round = 0
        self.last_change = 0
        self.joined = 0

    # group changes

    def recompute_targets(self) -> None:
        group = GroupSpec.of(
            [
                replace(
                    worker.spec,
                    owned=self.targets.get(member_id, ()),
                    member_epoch=self.holdings[member_id].member_epoch,
                )
                for member_id, worker in self.workers.items()
            ],
            self.topics.values(),
        )
        self.targets = dict(self.assignor.assign(group))
        self.last_change = self.round

    def join(self) -> None:
        self.joined += 1
        subscription = (
            SUBSCRIPTIONS[1] if self.same_subscription else self.rng.choice(SUBSCRIPTIONS)
        )
        spec = MemberSpec(f"m{self.rng.randrange(1000):03d}-{self.joined}", subscription)
        if self.rng.random() < 0.2:
            spec = replace(spec, allow_individual_commit=False)
        self.workers[spec.member_id] = Worker(spec, next_heartbeat=self.round)
        self.holdings[spec.member_id] = MemberHolding()
        self.recompute_targets()

    def leave(self, member_id: str) -> None:
        # A leaving member stops working before its leave heartbeat.
        self.remove(member_id)

    def crash(self, member_id: str) -> None:
        # Until its session expires, the crashed member may still be working (a zombie).
        self.workers[member_id].silent_since = self.round

    def grow(self) -> None:
        name = self.rng.choice(sorted(self.topics))
        topic = self.topics[name]
        self.topics[name] = replace(topic, partition_count=topic.partition_count + 1)
        self.recompute_targets()

    def remove(self, member_id: str) -> None:
        del self.workers[member_id]
        del self.holdings[member_id]
        self.recompute_targets()

    def random_change(self) -> None:
        live = sorted(m for m, w in self.workers.items() if w.silent_since is None)
        change = self.rng.random()
        if change < 0.4 or len(live) < 2:
            self.join()
        elif change < 0.65:
            self.leave(self.rng.choice(live))
        elif change < 0.85:
            self.crash(self.rng.choice(live))
        else:
            self.grow()

    # time

    def step(self) -> None:
        self.round += 1
        for member_id, worker in sorted(self.workers.items()):
            if worker.silent_since is not None:
                if self.round - worker.silent_since >= SESSION_ROUNDS:
                    self.remove(member_id)
            elif worker.next_heartbeat <= self.round:
                self.heartbeat(member_id)
        self.check_safety()

    def heartbeat(self, member_id: str) -> None:
        worker = self.workers[member_id]
        holding = self.holdings[member_id]
        owned = accept_reported_owned(worker.working_on, holding)
        assert owned == normalize_slices(worker.working_on), "reported more than it held"
        self.holdings[member_id] = replace(holding, owned=owned)
        decision = reconcile_member(member_id, self.holdings, self.targets.get(member_id, ()))
        self.holdings[member_id] = MemberHolding(owned, decision.assigned, decision.member_epoch)
        revoked = subtract_slices(worker.working_on, decision.assigned)
        if revoked and not worker.delayed_release and self.rng.random() < 0.3:
            # Still finishing in-flight records of a revoked slice: released a heartbeat later.
            worker.working_on = union_slices(worker.working_on, decision.assigned)
            worker.delayed_release = True
        else:
            worker.working_on = decision.assigned
            worker.delayed_release = False
        worker.next_heartbeat = self.round + self.rng.randint(1, MAX_HEARTBEAT_GAP)

    # checks

    def check_safety(self) -> None:
        held = {member_id: holding.held for member_id, holding in self.holdings.items()}
        assert find_overlaps(held) == [], f"round {self.round}: coordinator holdings overlap"
        working = {member_id: w.working_on for member_id, w in self.workers.items()}
        assert find_overlaps(working) == [], f"round {self.round}: members work on the same keys"
        for member_id, worker in self.workers.items():
            assert subtract_slices(worker.working_on, held[member_id]) == ()

    def converged(self) -> bool:
        return all(
            self.holdings[member_id].assigned == self.targets.get(member_id, ())
            and self.holdings[member_id].owned == self.holdings[member_id].assigned
            and normalize_slices(worker.working_on) == self.holdings[member_id].assigned
            for member_id, worker in self.workers.items()
        )


@pytest.mark.parametrize("assignor", ASSIGNORS.values(), ids=ASSIGNORS.keys())
@given(seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_random_rebalances_never_overlap_and_converge(assignor: Assignor, seed: int) -> None:
    rng = random.Random(seed)
    simulation = Simulation(assignor, rng)
    for _ in range(rng.randint(1, 4)):
        simulation.join()
    for _ in range(rng.randint(10, 60)):
        if rng.random() < 0.3:
            simulation.random_change()
        simulation.step()

    while simulation.round - simulation.last_change <= CONVERGENCE_ROUNDS:
        if simulation.converged():
            break
        simulation.step()

    assert simulation.converged(), (
        f"not converged {simulation.round - simulation.last_change} rounds after the last change"
    )
    assigned = {member_id: holding.assigned for member_id, holding in simulation.holdings.items()}
    assert assigned == {member_id: simulation.targets[member_id] for member_id in assigned}
