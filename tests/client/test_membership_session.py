"""The session deadline on its own (docs/design.md §5, "The client half"): counted from the
send time of the last good heartbeat, noticed by the first to ask once it passed, and told
once, whoever asks after."""

from __future__ import annotations

import time

import pytest

from client.membership.session import Session


def test_no_deadline_until_a_heartbeat_succeeded_nor_after_the_membership_ended() -> None:
    session = Session(10.0, on_lost=lambda: None)
    assert session.deadline() == float("inf")
    assert not session.lost()
    session.renewed(time.monotonic() - 20, 10.0)
    session.ended()
    assert session.deadline() == float("inf")
    assert not session.lost()


def test_the_deadline_counts_from_the_send_with_the_coordinator_s_timeout() -> None:
    session = Session(10.0, on_lost=lambda: None)
    sent_at = time.monotonic() - 1
    session.renewed(sent_at, 3.0)
    assert session.deadline() == pytest.approx(sent_at + 3.0)
    assert 0 < session.left_s() <= 2.0
    assert not session.lost()


def test_the_first_to_ask_past_the_deadline_starts_the_loss_once() -> None:
    told: list[str] = []
    session = Session(10.0, on_lost=lambda: told.append("lost"))
    session.renewed(time.monotonic() - 2, 1.0)
    assert session.lost()
    assert session.lost()
    assert told == ["lost"]
    assert session.deadline() == float("-inf")
    session.ended()
    session.recovered()
    assert not session.lost()
    assert session.deadline() == float("inf")


def test_a_refused_membership_is_lost_whatever_the_clock_says() -> None:
    told: list[str] = []
    session = Session(10.0, on_lost=lambda: told.append("lost"))
    session.renewed(time.monotonic(), 10.0)
    session.mark_lost()
    session.mark_lost()
    assert session.lost()
    assert told == ["lost"]


def test_a_call_gets_what_is_left_of_the_session_but_never_less_than_a_floor() -> None:
    session = Session(6.0, on_lost=lambda: None)
    assert session.call_timeout_s() == 6.0
    session.renewed(time.monotonic() - 4, 6.0)
    assert 0 < session.call_timeout_s() <= 2.0
    session.renewed(time.monotonic() - 7, 6.0)
    assert session.call_timeout_s() == 0.05
