"""Stuck calls over a real migrated Postgres: a member reports the calls still running on keys
of slices it was asked to give up, the admin API shows them (aged), the gauges count them,
and a malformed report is refused with nothing applied (docs/api.md, "Stuck calls")."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import generate_latest
from sqlalchemy import text

from coordinator import metrics
from coordinator.groups.loops import _GaugeLabels, update_gauges
from tests.groups.test_heartbeat_api import Member, describe, given_topics, metric_value

HASH_MAX = 2**63 - 1


def stuck_call(key_hash: int, offset: int, running_s: float, partition: int = 0) -> dict[str, Any]:
    return {
        "topic": "held",
        "partition": partition,
        "key_hash": key_hash,
        "offset": offset,
        "running_s": running_s,
    }


async def stuck_of(api: httpx.AsyncClient, group: str) -> dict[str, list[dict[str, Any]]]:
    return {m["member_id"]: m["stuck"] for m in (await describe(api, group))["members"]}


def unaged(members: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Members as stored: without the figures a description ages to its own moment."""
    aged = {"report_age_s", "running_for_s", "summary"}
    return [
        {**m, "stuck": [{k: v for k, v in c.items() if k not in aged} for c in m["stuck"]]}
        for m in members
    ]


async def age_report(app: FastAPI, group: str, seconds: int) -> None:
    """Make the group's reports ``seconds`` older, as if no heartbeat had changed them since."""
    async with app.state.engine.begin() as connection:
        await connection.execute(
            text(
                "UPDATE members SET stuck_reported_at = stuck_reported_at "
                "- make_interval(secs => :seconds) WHERE group_id = :group_id"
            ),
            {"group_id": group, "seconds": seconds},
        )


async def test_a_stable_members_report_is_stored_shown_aged_kept_and_cleared(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, held=2)
    member = Member(api, "stuck-report")
    await member.join(["held"])
    await member.heartbeat()
    assert (await describe(api, "stuck-report"))["state"] == "stable"
    assert await stuck_of(api, "stuck-report") == {member.member_id: []}

    # A stable member's heartbeat, which the one-statement path would serve: the report
    # must still be stored.
    epoch = member.epoch
    reply = await member.heartbeat(
        stuck=[stuck_call(HASH_MAX, 41, 12.5, partition=1), stuck_call(17, 9, 3.0)]
    )
    assert (reply["member_epoch"], len(reply["assignment"])) == (epoch, 2), "nothing else moves"
    await age_report(coordinator_app, "stuck-report", 60)
    (member_id, calls), *_ = (await stuck_of(api, "stuck-report")).items()
    assert member_id == member.member_id
    assert [(c["partition"], c["key_hash"], c["offset"], c["running_s"]) for c in calls] == [
        (0, 17, 9, 3.0),
        (1, HASH_MAX, 41, 12.5),
    ]
    first = calls[0]
    assert first["report_age_s"] == pytest.approx(60, abs=5)
    assert first["running_for_s"] == pytest.approx(63, abs=5)
    assert first["running_for_s"] - first["report_age_s"] == pytest.approx(3.0, abs=0.01)
    said = re.fullmatch(
        r"slice held\[0\] key hash 17 held by a stuck call at offset 9 for (\d+\.\d) s",
        first["summary"],
    )
    assert said is not None, first["summary"]
    assert float(said[1]) == pytest.approx(first["running_for_s"], abs=0.05)
    assert datetime.fromisoformat(first["reported_at"]) == datetime.fromisoformat(
        calls[1]["reported_at"]
    )

    # No field: unchanged, still aged from the report.
    await member.heartbeat()
    still = (await stuck_of(api, "stuck-report"))[member.member_id]
    assert [c["key_hash"] for c in still] == [17, HASH_MAX]
    assert still[0]["report_age_s"] >= 55

    # A new report replaces the old one and restarts its age.
    await member.heartbeat(stuck=[stuck_call(5, 100, 1.25)])
    (renewed,) = (await stuck_of(api, "stuck-report"))[member.member_id]
    assert (renewed["key_hash"], renewed["offset"], renewed["running_s"]) == (5, 100, 1.25)
    assert renewed["report_age_s"] < 30

    await member.heartbeat(stuck=[])
    assert await stuck_of(api, "stuck-report") == {member.member_id: []}


async def test_a_join_may_carry_a_report_and_a_leave_takes_it_with_the_member(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, held=2)
    member = Member(api, "stuck-join")
    await member.join(["held"], stuck=[stuck_call(7, 3, 0.5)])
    calls = (await stuck_of(api, "stuck-join"))[member.member_id]
    assert [(c["key_hash"], c["offset"], c["running_s"]) for c in calls] == [(7, 3, 0.5)]
    await member.send(member_id=member.member_id, member_epoch=-1, stuck=[stuck_call(8, 4, 1)])
    assert (await describe(api, "stuck-join"))["members"] == []
    async with coordinator_app.state.engine.connect() as connection:
        rows = await connection.execute(
            text("SELECT count(*) FROM members WHERE group_id = 'stuck-join'")
        )
        assert rows.scalar_one() == 0


MALFORMED = [
    {"partition": -1},
    {"partition": 2**31},
    {"key_hash": -1},
    {"key_hash": 2**63},
    {"offset": -1},
    {"offset": 2**63},
    {"offset": True},
    {"running_s": -0.5},
    {"running_s": "5"},
    {"topic": "bad topic"},
    {"extra": 1},
]


@pytest.mark.parametrize("change", MALFORMED, ids=[next(iter(c)) for c in MALFORMED])
async def test_a_malformed_report_is_refused_and_nothing_is_applied(
    api: httpx.AsyncClient, coordinator_app: FastAPI, change: dict[str, Any]
) -> None:
    await given_topics(coordinator_app, held=2)
    member = Member(api, "stuck-bad")
    await member.join(["held"], stuck=[stuck_call(1, 1, 1.0)])
    before = await describe(api, "stuck-bad")
    bad = {**stuck_call(2, 2, 2.0), **change}
    # Leaving with it must not leave either: the whole request is refused.
    for epoch in (member.epoch, -1):
        reply = await member.send(member_id=member.member_id, member_epoch=epoch, stuck=[bad])
        assert (reply.status_code, reply.json()["error"]) == (400, "INVALID_REQUEST"), reply.text
        assert "stuck" in reply.json()["detail"], reply.json()
    after = await describe(api, "stuck-bad")
    assert unaged(after["members"]) == unaged(before["members"])
    await member.leave()


async def test_too_many_calls_or_a_number_json_cannot_hold_are_refused(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, held=2)
    member = Member(api, "stuck-limits")
    await member.join(["held"])
    at_most = [stuck_call(i, i, 0.1) for i in range(1_000)]
    assert (
        await member.send(member_id=member.member_id, member_epoch=member.epoch, stuck=at_most)
    ).status_code == 200
    reply = await member.send(
        member_id=member.member_id, member_epoch=member.epoch, stuck=[*at_most, at_most[0]]
    )
    assert (reply.status_code, reply.json()["error"]) == (400, "INVALID_REQUEST")
    for number in ("Infinity", "NaN"):
        body = (
            f'{{"member_id": "{member.member_id}", "member_epoch": {member.epoch}, "stuck": '
            f'[{{"topic": "held", "partition": 0, "key_hash": 1, "offset": 1, '
            f'"running_s": {number}}}]}}'
        )
        reply = await api.post(
            "/v1/groups/stuck-limits/heartbeat",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert (reply.status_code, reply.json()["error"]) == (400, "INVALID_REQUEST"), number
    assert len((await stuck_of(api, "stuck-limits"))[member.member_id]) == 1_000


async def test_the_gauges_count_live_members_stuck_calls_and_the_longest(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, held=2)
    first, second = Member(api, "stuck-gauge"), Member(api, "stuck-gauge")
    await first.join(["held"], stuck=[stuck_call(1, 1, 2.0), stuck_call(2, 5, 30.0)])
    await second.join(["held"], stuck=[stuck_call(3, 8, 4.0)])
    await age_report(coordinator_app, "stuck-gauge", 100)

    def per_group(name: str) -> float | None:
        exposition = generate_latest(metrics.TENANT_REGISTRY).decode()
        return metric_value(exposition, name, group_id="stuck-gauge")

    await update_gauges(coordinator_app.state.engine, None, _GaugeLabels())
    assert per_group("keyrange_member_stuck_calls") == 3
    longest = per_group("keyrange_member_stuck_call_max_seconds")
    assert longest == pytest.approx(130, abs=10)
    # Set and read with no await between: other apps in this process share these gauges.
    await update_gauges(coordinator_app.state.engine, None, _GaugeLabels())
    assert metrics.STUCK_CALLS._value.get() >= 3
    assert metrics.STUCK_CALL_MAX_SECONDS._value.get() >= 100

    await first.heartbeat(stuck=[])
    await update_gauges(coordinator_app.state.engine, None, _GaugeLabels())
    assert per_group("keyrange_member_stuck_calls") == 1
    assert per_group("keyrange_member_stuck_call_max_seconds") == pytest.approx(104, abs=10)
    await second.leave()
    await update_gauges(coordinator_app.state.engine, None, _GaugeLabels())
    assert (
        per_group("keyrange_member_stuck_calls"),
        per_group("keyrange_member_stuck_call_max_seconds"),
    ) == (0, 0)
