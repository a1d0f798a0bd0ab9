"""Subscription patterns on RE2: whole-name matches as Kafka's regex subscriptions, the
reason when a pattern cannot run, and stored patterns RE2 refuses matching nothing."""

from __future__ import annotations

import pytest

from coordinator.core.topic_pattern import (
    InvalidTopicPattern,
    compile_topic_pattern,
    matching_topics,
)

TOPICS = ["orders", "orders.eu", "orders-archive", "payments"]


def test_a_pattern_matches_whole_topic_names_only() -> None:
    assert matching_topics(r"orders(\..+)?", TOPICS) == {"orders", "orders.eu"}
    assert matching_topics("order", TOPICS) == set()


def test_patterns_that_backtrack_exponentially_elsewhere_simply_do_not_match() -> None:
    long_names = ["a" * 40, "team.orders-2024-archive.v2.eu-west"]
    assert matching_topics(r"([\w.-]|[\w.-])*!", long_names) == set()
    assert matching_topics("(.*)" * 26 + "!", long_names) == set()
    assert matching_topics("(.*)" * 26, long_names) == set(long_names)


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(orders)\1", "invalid escape sequence"),
        (r"(?<=x)orders", "invalid perl operator"),
        (r"orders{2000}", "invalid repetition size"),
        (r"orders[", "missing ]"),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_with_its_reason(pattern: str, reason: str) -> None:
    with pytest.raises(InvalidTopicPattern, match="not valid RE2 syntax") as refused:
        compile_topic_pattern(pattern)
    assert reason in str(refused.value)


def test_a_stored_pattern_re2_refuses_matches_no_topic() -> None:
    assert matching_topics(r"(orders)\1", ["ordersorders"]) == set()
