"""Issue 46 item 8, second half (review finding L7): a graceful revocation during a
coordinator outage does not release uncommitted work silently. The release's commit is asked
again while the coordinator does not answer, within the session deadline, so a blip costs no
duplicates; a release that gives up says what it could not commit."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.structs import TopicPartition

from client import KeyrangeConsumer, key_hash
from client.protocol.keyspace import KeyRange
from tests.chaos.proxy import DROP, TcpProxy
from tests.client.test_consumer import KEYS, LOWER, UPPER, consumer_for, group, produce, take
from tests.client.test_worker import processed_offsets
from tests.e2e.harness import allow_range_fetch
from tests.fixtures.services import MakeTopic
from tests.waiting import until

pytestmark = [pytest.mark.kafka, pytest.mark.db]

# Longer than the HTTP client's own retries of one request (about a second), shorter than
# any test timeout.
OUTAGE_S = 3.0


async def test_a_revocation_during_a_coordinator_outage_commits_once_it_answers_again(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await make_topic(1)
    tp = TopicPartition(topic, 0)
    await produce(kafka_bootstrap, topic, KEYS)
    port = int(coordinator_url.rsplit(":", 1)[1])
    link = await TcpProxy([("127.0.0.1", port)]).start()
    group_id = group()
    revoked = {o for o, key in enumerate(KEYS) if UPPER.contains(key_hash(key, o))}
    caplog.set_level(logging.WARNING, logger="client")
    try:
        async with consumer_for(kafka_bootstrap, link.url, group_id) as consumer:
            consumer.assign({tp: []})
            await take(consumer, len(KEYS))
            link.cut(DROP)
            # A graceful revocation of the upper half while the coordinator is away: its
            # processed records are committed once the coordinator answers again.
            consumer.assign({tp: [LOWER]})
            await asyncio.sleep(OUTAGE_S)
            link.heal()
            await consumer.wait_for_assignment()
            assert revoked <= await processed_offsets(coordinator_url, group_id, topic, KEYS)
    finally:
        await link.stop()
    assert not [r for r in caplog.records if "not committed" in r.getMessage()]


async def test_a_revocation_that_cannot_commit_within_its_session_says_what_it_leaves(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await make_topic(1)
    tp = TopicPartition(topic, 0)
    await allow_range_fetch(coordinator_url, topic)
    await produce(kafka_bootstrap, topic, KEYS)
    port = int(coordinator_url.rsplit(":", 1)[1])
    link = await TcpProxy([("127.0.0.1", port)]).start()
    group_id = group()
    caplog.set_level(logging.WARNING, logger="client")
    options = {"session_timeout_ms": 3_000, "revoke_timeout_s": 1.0}
    try:
        async with KeyrangeConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=link.url,
            group_id=group_id,
            auto_commit_interval_ms=None,
            **options,  # type: ignore[arg-type]
        ) as first:
            await first.wait_for_assignment()
            records = await take(first, len(KEYS), mark=False)
            # All processed but one, which keeps the revocation's drain waiting.
            for record in records[1:]:
                first.mark_processed(record)
            async with KeyrangeConsumer(
                topic,
                bootstrap_servers=kafka_bootstrap,
                coordinator_url=coordinator_url,
                group_id=group_id,
                **options,  # type: ignore[arg-type]
            ):
                await until(
                    lambda: first.assignment().get(tp) != [KeyRange.full()],
                    30,
                    "the first member to start giving half up",
                )
                # The coordinator goes away for the first member until past its session.
                link.cut(DROP)

                def gave_up() -> list[logging.LogRecord]:
                    return [r for r in caplog.records if "not committed" in r.getMessage()]

                await until(gave_up, 30, "the release to give its commit up")
                warning = gave_up()[0]
                assert warning.levelno == logging.WARNING
                assert warning.slices  # type: ignore[attr-defined]
                assert any(  # type: ignore[attr-defined]
                    "committed up to" in line for line in warning.uncommitted
                )
                link.heal()
    finally:
        await link.stop()
