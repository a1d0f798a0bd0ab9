"""The kernel's byte budget alone: a partition pauses over its share of the bound and resumes
below the ratio, the share follows the partitions owned, a record's weight, and the record
cap the streams runtime's deprecated ``max_buffered_records`` keeps."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from client.runtime.budget import RECORD_OVERHEAD_BYTES, ByteBudget, weight

TP = TopicPartition("orders", 3)


@dataclass(frozen=True)
class Sized:
    serialized_key_size: int
    serialized_value_size: int


def test_a_partition_pauses_over_its_share_and_resumes_below_the_ratio() -> None:
    paused: list[TopicPartition] = []
    resumed: list[TopicPartition] = []
    budget = ByteBudget(1_000, 0.5, paused.extend, resumed.extend)
    budget.set_partitions(2)  # a share of 500 bytes each
    budget.charge(TP, 500)
    assert paused == []
    budget.charge(TP, 1)
    assert paused == [TP] and budget.paused == {TP}
    budget.refund(TP, 200)  # 301: over half the share still
    assert resumed == []
    budget.refund(TP, 51)  # 250
    assert resumed == [TP] and budget.paused == frozenset()
    assert budget.total == 250 and budget.pauses == 1


def test_a_smaller_share_after_more_partitions_are_owned_pauses_the_next_charge() -> None:
    paused: list[TopicPartition] = []
    budget = ByteBudget(1_000, 0.9, paused.extend, lambda _: None)
    budget.charge(TP, 600)
    assert paused == []
    budget.set_partitions(2)
    budget.charge(TP, 1)
    assert paused == [TP]


def test_a_larger_share_after_partitions_are_given_up_resumes_a_paused_one() -> None:
    resumed: list[TopicPartition] = []
    budget = ByteBudget(1_000, 0.9, lambda _: None, resumed.extend)
    budget.set_partitions(4)
    budget.charge(TP, 300)
    assert budget.paused == {TP}
    budget.set_partitions(1)
    assert resumed == [TP] and budget.paused == frozenset()


def test_a_paused_partition_is_paused_again_by_every_charge_over_its_share() -> None:
    """A reassignment resumes every partition in the Kafka consumer: the next charge over
    the share pauses it there again, though the budget counts one pause."""
    paused: list[TopicPartition] = []
    budget = ByteBudget(100, 0.5, paused.extend, lambda _: None)
    budget.charge(TP, 101)
    budget.charge(TP, 1)
    assert paused == [TP, TP] and budget.pauses == 1


def test_refunds_of_other_partitions_leave_a_paused_one_paused() -> None:
    other = TopicPartition("orders", 4)
    budget = ByteBudget(100, 0.5, lambda _: None, lambda _: None)
    budget.charge(TP, 101)
    budget.charge(other, 10)
    budget.refund(other, 10)
    assert budget.paused == {TP} and budget.total == 101


def test_a_record_weighs_its_stored_key_and_value_plus_the_overhead() -> None:
    assert weight(Sized(3, 10)) == 13 + RECORD_OVERHEAD_BYTES
    # aiokafka reports -1 for a missing key or value.
    assert weight(Sized(-1, -1)) == RECORD_OVERHEAD_BYTES


def test_the_record_cap_pauses_at_that_many_records_until_drained_to_the_ratio() -> None:
    """What ``max_buffered_records`` always did (an input holding that many records paused
    until it drained to half), now counted by the budget, beside bytes far from their bound."""
    paused: list[TopicPartition] = []
    resumed: list[TopicPartition] = []
    budget = ByteBudget(10**9, 0.5, paused.extend, resumed.extend, max_records=4)
    for _ in range(3):
        budget.charge(TP, 10)
    assert paused == []
    budget.charge(TP, 10)
    assert paused == [TP]
    budget.refund(TP, 10)  # 3 records: not drained to half
    assert resumed == []
    budget.refund(TP, 10)  # 2 records
    assert resumed == [TP] and budget.paused == frozenset()


def test_a_refund_of_many_records_at_once_counts_them_all() -> None:
    resumed: list[TopicPartition] = []
    budget = ByteBudget(10**9, 0.5, lambda _: None, resumed.extend, max_records=4)
    for _ in range(6):
        budget.charge(TP, 10)
    budget.refund(TP, 40, records=4)
    assert resumed == [TP] and budget.total == 20
