"""A member that a switch leaves without records says so once, naming the switch and how to
turn it on, and the SDK offers the call that does, which the running group sees at once."""

from __future__ import annotations

import logging
import uuid

import httpx
import pytest

from client import CoordinatorClient, KeyrangeConsumer
from tests.fixtures.services import MakeTopic
from tests.waiting import until


async def test_an_idle_member_logs_the_switch_once_and_the_sdk_can_turn_it_on(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await make_topic(1)  # accept.range.fetch is off by default
    options = {
        "bootstrap_servers": kafka_bootstrap,
        "coordinator_url": coordinator_url,
        "group_id": f"idle-{uuid.uuid4().hex[:8]}",
    }
    caplog.set_level(logging.WARNING, logger="client.membership")
    async with (
        KeyrangeConsumer(topic, **options) as first,  # type: ignore[arg-type]
        KeyrangeConsumer(topic, **options) as second,  # type: ignore[arg-type]
    ):

        def idle_warnings() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "gets no records" in r.getMessage()]

        await until(lambda: idle_warnings(), 30, "the idle member's warning")
        await until(lambda: bool(first.assignment()) != bool(second.assignment()), 30, "one owner")
        [warning] = idle_warnings()
        assert warning.levelno == logging.WARNING
        assert warning.__dict__["switch"] == "accept.range.fetch"
        assert f"keyrange admin topic-config {topic} --accept-range-fetch true" in (
            warning.getMessage()
        )
        assert "set_accept_range_fetch" in warning.getMessage()

        async with CoordinatorClient(coordinator_url) as admin:
            await admin.set_accept_range_fetch(topic)
        async with httpx.AsyncClient(base_url=coordinator_url) as api:
            config = (await api.get(f"/v1/admin/topics/{topic}/config")).json()
        assert config["accept_range_fetch"] is True

        # The switch reaches the running group without waiting for a join or a leave.
        await until(
            lambda: bool(first.assignment()) and bool(second.assignment()),
            30,
            "both members sharing the partition after the switch",
        )
