"""A consumer pointed at a wrong ``coordinator_url`` gives up within its bound, saying where
it looked, and says so at WARNING while it retries."""

from __future__ import annotations

import logging

import pytest

from client import KeyrangeConsumer
from client.errors import CoordinatorUnavailable, Unauthorized
from tests.client.test_consumer import StartCoordinator
from tests.fixtures.coordinator import free_port


async def test_start_gives_up_on_a_wrong_coordinator_url_and_names_it(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    consumer = KeyrangeConsumer(
        "orders",
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=nowhere,
        group_id="g",
        coordinator_start_timeout_ms=1_500,
    )
    caplog.set_level(logging.WARNING, logger="client.http")
    with pytest.raises(
        CoordinatorUnavailable, match=f"no Keyrange coordinator answered at {nowhere}"
    ):
        await consumer.start()
    retries = [r for r in caplog.records if r.name == "client.http"]
    # Rate-limited: the first retry warns, the rest of the 1.5 s go to DEBUG.
    assert len(retries) == 1
    assert retries[0].levelno == logging.WARNING and retries[0].url == nowhere
    await consumer.stop()


async def test_start_fails_at_once_on_an_answer_that_retrying_cannot_change(
    kafka_bootstrap: str, start_coordinator: StartCoordinator, database_url: str
) -> None:
    coordinator = await start_coordinator(database_url, admin_tokens=["a"])
    consumer = KeyrangeConsumer(
        "orders",
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator.url,
        group_id="g",
        token="wrong",
    )
    with pytest.raises(Unauthorized):
        await consumer.start()
