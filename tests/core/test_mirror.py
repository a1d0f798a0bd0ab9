"""The offset mirror's decisions: what to write to Kafka, and which refusals to name again."""

from __future__ import annotations

from coordinator.core.mirror import SkippedGroups, kafka_group_name, offsets_to_mirror


def test_only_offsets_kafka_does_not_hold_are_written_backwards_too() -> None:
    stored = {("t", 0): 10, ("t", 1): 4, ("t", 2): 7}
    in_kafka = {("t", 0): 10, ("t", 1): 9}
    # Partition 1 went back (an offset reset): Kafka follows, as it follows any move.
    assert offsets_to_mirror(stored, in_kafka) == {("t", 1): 4, ("t", 2): 7}


def test_a_skipped_group_is_named_once_until_it_is_written_again() -> None:
    skipped = SkippedGroups()
    assert [skipped.first_time("g") for _ in range(3)] == [True, False, False]
    skipped.written("g")
    assert skipped.first_time("g")


def test_the_prefix_goes_in_front_of_the_group_id() -> None:
    assert kafka_group_name("keyrange.", "orders") == "keyrange.orders"
    assert kafka_group_name("", "orders") == "orders"
