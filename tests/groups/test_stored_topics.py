"""The memory of topics seen stored, which lets a join skip reading partition counts before
its transaction (coordinator/groups/stored_topics.py)."""

from __future__ import annotations

import pytest

from coordinator.groups import stored_topics
from coordinator.groups.stored_topics import StoredTopics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_topic_counts_as_stored_for_the_interval_after_it_was_seen() -> None:
    clock = Clock()
    stored = StoredTopics(ttl_s=10.0, clock=clock)
    stored.remember(["orders"])
    clock.now += 9.9
    assert stored.all_stored({"orders"})
    clock.now += 0.2
    assert not stored.all_stored({"orders"})


def test_every_topic_must_have_been_seen() -> None:
    stored = StoredTopics(ttl_s=10.0, clock=Clock())
    stored.remember(["orders"])
    assert not stored.all_stored({"orders", "payments"})
    assert stored.all_stored(set())


def test_seeing_a_topic_again_renews_it() -> None:
    clock = Clock()
    stored = StoredTopics(ttl_s=10.0, clock=clock)
    stored.remember(["orders"])
    clock.now += 8
    stored.remember(["orders"])
    clock.now += 8
    assert stored.all_stored({"orders"})


def test_the_oldest_topics_are_forgotten_past_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stored_topics, "REMEMBERED_LIMIT", 2)
    clock = Clock()
    stored = StoredTopics(ttl_s=10.0, clock=clock)
    stored.remember(["a"])
    stored.remember(["b"])
    stored.remember(["a"])  # seen again: now the newest
    stored.remember(["c"])
    assert stored.all_stored({"a", "c"})
    assert not stored.all_stored({"b"})


def test_a_forgotten_topic_is_no_longer_stored() -> None:
    stored = StoredTopics(ttl_s=10.0, clock=Clock())
    stored.remember(["orders", "payments"])
    stored.forget(["orders", "never-seen"])
    assert stored.all_stored({"payments"}) and not stored.all_stored({"orders"})
