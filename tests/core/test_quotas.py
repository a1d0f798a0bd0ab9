"""The caps' decisions, without I/O (coordinator/core/quotas.py)."""

from __future__ import annotations

from coordinator.core.quotas import (
    WHOLE_COORDINATOR,
    group_refusals,
    group_scope,
    member_cap_refusal,
    partition_refusals,
)
from coordinator.errors import GroupMaxPartitionsReached, MaxGroupsReached


def test_a_new_group_counts_against_the_most_specific_prefix_it_matches() -> None:
    prefixes = ("team-a.", "team-a.eu.", "team-b.")
    assert group_scope(prefixes, "team-a.eu.orders") == "team-a.eu."
    assert group_scope(prefixes, "team-a.orders") == "team-a."
    assert group_scope((), "anything") == WHOLE_COORDINATOR


def test_the_member_cap_counts_live_members() -> None:
    assert member_cap_refusal("g", 2, 3) is None
    refused = member_cap_refusal("g", 3, 3)
    assert refused is not None and refused.status == 409


def test_groups_admitted_earlier_in_a_batch_count_against_later_ones() -> None:
    decided = group_refusals(
        [("a.1", "a."), ("b.1", "b."), ("a.2", "a."), ("a.1", "a."), ("a.3", "a.")],
        {"a.": 1},
        3,
    )
    assert decided["a.1"] is None and decided["b.1"] is None and decided["a.2"] is None
    assert isinstance(decided["a.3"], MaxGroupsReached)


def test_partitions_added_twice_count_once_and_a_refused_request_adds_none() -> None:
    decided = partition_refusals(
        [
            ("g", {("t", 0), ("t", 1)}),
            ("g", {("t", 1), ("t", 2)}),
            ("g", {("t", 3), ("t", 4)}),
            ("g", {("t", 3)}),
            ("g", set()),
        ],
        {"g": 1},
        4,
    )
    assert decided[0] is None and decided[1] is None
    assert isinstance(decided[2], GroupMaxPartitionsReached)
    assert decided[3] is not None and decided[4] is None
