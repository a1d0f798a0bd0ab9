"""The worker runtime's pure parts: the failure policy's next step, backoff, dead-letter
headers and the settings' checks (the byte budget is the kernel's: tests/runtime)."""

from __future__ import annotations

import random

import pytest

from client.worker import WorkerConfig
from client.worker.failures import (
    Backoff,
    FailureHistory,
    Next,
    dead_letter_headers,
    next_step,
)


@pytest.mark.parametrize(
    ("policy", "attempts", "still_ours", "expected"),
    [
        ("at_least_once", 1, True, Next.STOP),
        ("skip", 1, True, Next.SKIP),
        ("retry", 1, True, Next.RETRY),
        ("retry", 2, True, Next.RETRY),
        ("retry", 3, True, Next.DEAD_LETTER),
        ("retry", 1, False, Next.GIVE_BACK),
        ("at_least_once", 1, False, Next.GIVE_BACK),
    ],
)
def test_the_next_step_after_a_failure(
    policy: str, attempts: int, still_ours: bool, expected: Next
) -> None:
    assert next_step(policy, attempts, 3, still_ours=still_ours) is expected


def test_backoff_doubles_up_to_its_cap_with_up_to_half_taken_off() -> None:
    backoff = Backoff(0.5, 4.0)
    rng = random.Random(1)
    for retry, base in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (200, 4.0)]:
        delays = [backoff.delay(retry, rng) for _ in range(200)]
        assert all(base / 2 <= delay <= base for delay in delays)
        assert max(delays) - min(delays) > base / 4, "no jitter"


def test_dead_letter_headers_name_the_origin_and_replace_an_earlier_one() -> None:
    history = FailureHistory(3, ValueError("x" * 10_000), 1_000, 2_000)
    earlier = [("trace", b"abc"), ("keyrange.origin.offset", b"1")]
    headers = dead_letter_headers("orders", 3, 42, 999, 7, history, earlier)
    names = [name for name, _ in headers]
    assert names.count("keyrange.origin.offset") == 1
    values = dict(headers)
    assert values["trace"] == b"abc"
    assert values["keyrange.origin.topic"] == b"orders"
    assert values["keyrange.origin.partition"] == b"3"
    assert values["keyrange.origin.offset"] == b"42"
    assert values["keyrange.origin.timestamp"] == b"999"
    assert values["keyrange.key.hash"] == b"7"
    assert values["keyrange.attempts"] == b"3"
    assert values["keyrange.error.type"] == b"builtins.ValueError"
    assert len(values["keyrange.error.message"]) == 4096
    assert (values["keyrange.failure.first"], values["keyrange.failure.last"]) == (b"1000", b"2000")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"topics": []}, "at least one topic"),
        ({"max_concurrency": 0}, "max_concurrency must be at least 1"),
        ({"failure_policy": "never"}, "failure_policy must be one of"),
        ({"resume_ratio": 1.5}, "resume_ratio"),
        ({"processing_timeout_s": 0}, "processing_timeout_s must be greater than 0"),
        ({"retry_backoff_s": 5, "retry_backoff_max_s": 1}, "retry_backoff_max_s"),
        ({"metrics_port": 70_000}, "metrics_port"),
    ],
)
def test_bad_settings_are_one_clear_error(overrides: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {
        "topics": ["t"],
        "group_id": "g",
        "bootstrap_servers": "b",
        "coordinator_url": "http://c",
        **overrides,
    }
    with pytest.raises(ValueError, match=message):
        WorkerConfig(**settings)  # type: ignore[arg-type]


def test_the_dead_letter_topic_defaults_to_the_groups() -> None:
    config = WorkerConfig(
        topics=["t"], group_id="billing", bootstrap_servers="b", coordinator_url="c"
    )
    assert config.dead_letters == "billing.dead-letters"
    assert config.threads == config.max_concurrency
