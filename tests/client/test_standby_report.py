"""A member reports the key ranges it keeps standbys of: heartbeats carry them until one is
answered, a change wakes the heartbeat at once, a new membership sends them again, and a
member that keeps none never sends the field (docs/api.md, "Standby key ranges")."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from aiokafka.structs import TopicPartition

from client import KeyrangeConsumer
from client.http import HeartbeatRequest
from client.membership.reports import Reports
from client.protocol.keyspace import KeyRange
from tests.fixtures.services import MakeTopic
from tests.waiting import until

LOWER = KeyRange(0, 2**62 - 1)


def test_standbys_are_sent_until_stored_and_again_for_a_new_membership() -> None:
    reports = Reports("g", list)
    assert reports.standbys() is None, "a member keeping none says nothing"

    assert reports.set_standbys({TopicPartition("t", 1): [LOWER]})
    sent = reports.standbys()
    assert sent == {TopicPartition("t", 1): [LOWER]}
    assert reports.standbys() == sent, "sent again while no reply confirmed it"
    reports.standbys_stored(sent)
    assert reports.standbys() is None
    assert not reports.set_standbys({TopicPartition("t", 1): [LOWER]}), "no news, no wake"

    # A report whose heartbeat got no answer (cut short by the next change): the next one
    # says where things stand, even when that is what the member reported before.
    assert reports.set_standbys({})
    assert reports.standbys() == {}
    assert reports.set_standbys({TopicPartition("t", 1): [LOWER]})
    assert reports.standbys() == sent
    reports.standbys_stored(sent)

    reports.standbys_forgotten()
    assert reports.standbys() == sent, "a new member row starts with none"
    reports.standbys_stored(sent)

    assert reports.set_standbys({TopicPartition("t", 1): []})
    assert reports.standbys() == {}, "an empty report clears the stored one"


def test_the_field_is_sent_only_when_there_is_something_to_say() -> None:
    plain = HeartbeatRequest(member_epoch=3, member_id="m-1")
    assert "standbys" not in plain.to_json()
    cleared = HeartbeatRequest(member_epoch=3, member_id="m-1", standbys={})
    assert cleared.to_json()["standbys"] == []
    warm = HeartbeatRequest(
        member_epoch=3, member_id="m-1", standbys={TopicPartition("t", 1): [LOWER]}
    )
    assert warm.to_json()["standbys"] == [
        {"topic": "t", "partition": 1, "ranges": [[LOWER.start, LOWER.end]]}
    ]


async def test_a_consumers_standbys_reach_the_coordinator_and_follow_changes(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(2)
    group = f"standby-report-{uuid.uuid4().hex[:8]}"

    async def described() -> list[Any]:
        async with httpx.AsyncClient(base_url=coordinator_url) as api:
            reply = await api.get(f"/v1/admin/groups/{group}")
        return [] if reply.status_code != 200 else list(reply.json()["members"])

    async def reported(expected: list[dict[str, Any]]) -> bool:
        members = await described()
        return len(members) == 1 and members[0]["standbys"] == expected

    consumer = KeyrangeConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator_url,
        group_id=group,
        assignor="sticky-join",
        # Heartbeats far apart: only the report's own wake gets it there in time.
        session_timeout_ms=30_000,
    )
    async with consumer:
        await until(lambda: consumer.assignment(), 30, "the member's assignment")
        consumer.report_standbys({TopicPartition(topic, 1): [LOWER]})
        expected = [{"topic": topic, "partition": 1, "ranges": [[LOWER.start, LOWER.end]]}]
        await until(lambda: reported(expected), 5, "the standbys stored")
        consumer.report_standbys({})
        await until(lambda: reported([]), 5, "the standbys cleared")
