"""An idle reason is logged once it outlasts the session (issue 47 item 6: right after a
coordinator freeze a worker told the user to turn on accept.range.fetch, while its partition
was only still held by its own earlier membership)."""

from __future__ import annotations

import logging

import pytest
from aiokafka.structs import TopicPartition

from client.http import HeartbeatReply, IdleNotice
from client.membership.reports import Reports
from client.protocol.keyspace import KeyRange

SWITCH = IdleNotice("accept.range.fetch", ("orders",), "every partition of orders is owned")


def reply(idle: IdleNotice | None, *, owns: bool = False) -> HeartbeatReply:
    assignment = {TopicPartition("orders", 0): [KeyRange.full()]} if owns else {}
    return HeartbeatReply("m-1", 3, 300, 3000, assignment=assignment, idle=idle)


def idle_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "gets no records" in r.getMessage()]


def test_an_idle_reason_is_logged_once_it_has_lasted_the_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="client.membership.reports")
    now = [0.0]
    reports = Reports("g", list, clock=lambda: now[0])
    for at in (0.0, 1.0, 2.9):
        now[0] = at
        reports.log_idle(reply(SWITCH))
    assert idle_warnings(caplog) == []
    for at in (3.0, 4.0, 60.0):
        now[0] = at
        reports.log_idle(reply(SWITCH))
    assert len(idle_warnings(caplog)) == 1


def test_an_idle_spell_that_ends_within_the_session_is_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The rejoin race: idle for less than a session, then the partition comes."""
    caplog.set_level(logging.WARNING, logger="client.membership.reports")
    now = [0.0]
    reports = Reports("g", list, clock=lambda: now[0])
    reports.log_idle(reply(SWITCH))
    now[0] = 2.0
    reports.log_idle(reply(None, owns=True))
    now[0] = 4.0
    reports.log_idle(reply(SWITCH))  # a new spell starts its own count
    now[0] = 6.5
    reports.log_idle(reply(SWITCH))
    assert idle_warnings(caplog) == []
    now[0] = 7.0
    reports.log_idle(reply(SWITCH))
    assert len(idle_warnings(caplog)) == 1
