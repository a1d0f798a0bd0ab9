"""Why a member is given nothing, when a switch is the cause."""

from __future__ import annotations

from dataclasses import replace

from coordinator.core.assignment import Slice
from coordinator.core.membership import MemberRecord, TopicFacts, idle_reason

MEMBER = MemberRecord(
    group_id="g",
    member_id="m-1",
    instance_id=None,
    client_id=None,
    client_host=None,
    member_epoch=1,
    previous_member_epoch=1,
    subscribed_topics=("orders",),
    subscribed_topic_regex=None,
    assignor=None,
    allow_individual_commit=True,
    session_timeout_ms=10_000,
)
TOPICS = TopicFacts(
    partition_counts={"orders": 1, "other": 3},
    accept_range_fetch={},
    default_accept_range_fetch=False,
    accept_individual_commit=True,
)


def test_a_topic_that_may_not_be_split_names_its_switch_and_the_command() -> None:
    idle = idle_reason(MEMBER, TOPICS)

    assert idle is not None
    assert (idle.switch, idle.topics) == ("accept.range.fetch", ("orders",))
    assert "keyrange admin topic-config orders --accept-range-fetch true" in idle.message


def test_the_coordinator_switch_is_named_before_the_topics() -> None:
    idle = idle_reason(MEMBER, replace(TOPICS, accept_individual_commit=False))

    assert idle is not None and idle.switch == "accept.individual.commit"
    assert "keyrange admin config --accept-individual-commit true" in idle.message


def test_a_member_that_opted_out_is_told_so() -> None:
    opted_out = replace(MEMBER, allow_individual_commit=False)
    idle = idle_reason(opted_out, replace(TOPICS, accept_range_fetch={"orders": True}))

    assert idle is not None and idle.switch == "allow.individual.commit"


def test_no_reason_when_the_member_has_a_target_or_its_topics_have_no_partitions() -> None:
    assert idle_reason(replace(MEMBER, target=(Slice.whole("orders", 0),)), TOPICS) is None
    assert idle_reason(replace(MEMBER, subscribed_topics=("absent",)), TOPICS) is None


def test_no_reason_when_every_switch_allows_sharing() -> None:
    assert idle_reason(MEMBER, replace(TOPICS, accept_range_fetch={"orders": True})) is None


def test_a_regex_subscription_is_resolved_against_the_known_topics() -> None:
    by_pattern = replace(MEMBER, subscribed_topics=(), subscribed_topic_regex="oth.*")
    idle = idle_reason(by_pattern, TOPICS)

    assert idle is not None and idle.topics == ("other",)
