"""Which heartbeat replies may wait for a change, and whom a change concerns."""

from __future__ import annotations

from client.protocol.keyspace import KeyRange
from coordinator.core.assignment import Slice
from coordinator.core.handoff import GroupChange, Hold, heartbeat_change, hold_for, settle_change

LOWER_KEYS, UPPER_KEYS = KeyRange.full().split(2)
WHOLE = (Slice.whole("t", 0),)
LOWER = (Slice("t", 0, LOWER_KEYS),)
UPPER = (Slice("t", 0, UPPER_KEYS),)


def test_a_member_owning_exactly_its_target_may_wait_for_anything_aimed_at_it() -> None:
    assert hold_for(3, WHOLE, 3, WHOLE, WHOLE) == Hold(short_of_target=False)


def test_a_member_still_waiting_for_part_of_its_target_may_wait_for_releases_too() -> None:
    assert hold_for(3, LOWER, 3, LOWER, WHOLE) == Hold(short_of_target=True)


def test_a_reply_with_a_new_epoch_goes_out_at_once() -> None:
    assert hold_for(3, WHOLE, 4, LOWER, LOWER) is None


def test_a_member_with_a_release_to_finish_or_a_grant_to_take_is_answered_at_once() -> None:
    assert hold_for(3, WHOLE, 3, LOWER, LOWER) is None  # still owns what it must give up
    assert hold_for(3, LOWER, 3, WHOLE, WHOLE) is None  # has not taken up its grant
    assert hold_for(3, None, 3, WHOLE, WHOLE) is None  # did not say what it owns


def test_the_report_is_compared_normalized() -> None:
    assert hold_for(3, (*UPPER, *LOWER), 3, WHOLE, WHOLE) == Hold(short_of_target=False)


def test_a_retargeted_member_is_concerned_whatever_it_waits_for() -> None:
    change = GroupChange("g", frozenset({"m-a"}), released=False, by="m-b")
    assert change.concerns("m-a", Hold(short_of_target=False))
    assert not change.concerns("m-c", Hold(short_of_target=True))


def test_a_release_concerns_only_members_short_of_their_target() -> None:
    change = GroupChange("g", frozenset(), released=True, by="m-b")
    assert change.concerns("m-a", Hold(short_of_target=True))
    assert not change.concerns("m-a", Hold(short_of_target=False))


def test_the_member_that_made_a_change_is_never_woken_by_it() -> None:
    change = GroupChange("g", None, released=True, by="m-a")
    assert not change.concerns("m-a", Hold(short_of_target=True))
    assert change.concerns("m-b", Hold(short_of_target=False))


def test_a_heartbeat_that_lets_hash_space_go_announces_a_release() -> None:
    change = heartbeat_change("g", "m-a", WHOLE, LOWER, retargeted=(), removed=())
    assert change == GroupChange("g", frozenset(), released=True, by="m-a")


def test_a_heartbeat_that_changes_nothing_for_others_announces_nothing() -> None:
    assert heartbeat_change("g", "m-a", LOWER, WHOLE, retargeted=(), removed=()) is None


def test_members_reaped_or_retargeted_by_a_heartbeat_are_announced() -> None:
    change = heartbeat_change("g", "m-a", (), (), retargeted=("m-b",), removed=("m-c",))
    assert change == GroupChange("g", frozenset({"m-b"}), released=True, by="m-a")


def test_an_admin_operation_announces_its_targets_and_removals() -> None:
    assert settle_change("g", {}, removed=False) is None
    assert settle_change("g", {"m-b": LOWER}, removed=True) == GroupChange(
        "g", frozenset({"m-b"}), released=True
    )
