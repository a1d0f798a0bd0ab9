"""Issue 46 item 2 (review finding H2): a held key is only the key that is held. A key kept
for a call that could not be stopped, granted back before the call ended, is this member's
again: its next records run under the new grant and are its to mark, so a later revocation
waits for them (or holds the key) before a third member starts the key. And a release asks
the gate what still runs even when the drain found nothing handed out.

Members run against the real broker and coordinator; a ledger notes each call's start and end
and the tests assert no key ran on two members at once."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from client import key_hash
from client.protocol.keyspace import KeyRange
from client.runtime.pools.processes import ProcessPool
from client.worker import Worker
from tests.client import worker_targets
from tests.client.test_consumer import produce
from tests.client.test_release import Ledger, Warnings
from tests.client.test_worker import config, group, running
from tests.client.test_worker_deadline import Slot, granted_gate, sent, starts
from tests.e2e.harness import allow_range_fetch
from tests.fixtures.services import MakeTopic
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.db]

_CANDIDATES = [b"hang-%d" % index for index in range(100)]
# One hanging key in each half of the key space, so whichever half a joining member takes,
# one of them moves.
HANGING = [
    next(k for k in _CANDIDATES if key_hash(k, 0) < 2**62),
    next(k for k in _CANDIDATES if key_hash(k, 0) >= 2**62),
]
FAST = [b"fast-%d" % index for index in range(16)]


@pytest.fixture
def client_log() -> Iterator[Warnings]:
    handler = Warnings()
    logger = logging.getLogger("client")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


class Hangs:
    """The first member's handler on its pool threads: the first call of each hanging key
    waits for ``first``, the second for ``second``; every call goes into the ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.first = threading.Event()
        self.second = threading.Event()
        self.seconds: dict[bytes, Any] = {}

    def handler(self, name: str) -> Callable[[Any], None]:
        seen: dict[bytes, int] = {}

        def handle(record: Any) -> None:
            call = self.ledger.start(name, record)
            if name == "first" and record.key in HANGING:
                seen[record.key] = seen.get(record.key, 0) + 1
                if seen[record.key] == 1:
                    self.first.wait(120)
                elif seen[record.key] == 2:
                    self.seconds[record.key] = record
                    self.second.wait(120)
            call.end = time.time()

        return handle

    def release(self) -> None:
        self.first.set()
        self.second.set()


async def test_a_held_key_granted_back_and_hanging_again_is_held_again_not_run_by_the_heir(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, client_log: Warnings
) -> None:
    topic = await make_topic(1)
    tp = TopicPartition(topic, 0)
    await allow_range_fetch(coordinator_url, topic)
    await produce(kafka_bootstrap, topic, [*HANGING, *FAST, *HANGING, *FAST])
    group_id = group()
    ledger = Ledger()
    hangs = Hangs(ledger)
    # Progress stays uncommitted between ownership changes, so the end of the hold has a
    # commit to wait for while the key's next record is handed out.
    settings = {
        "drain_timeout_s": 0.5,
        "max_concurrency": 8,
        "worker_threads": 8,
        "commit_interval_ms": 60_000,
    }

    def member(name: str) -> Worker:
        return Worker(
            config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
            handler=hangs.handler(name),
        )

    first = member("first")
    hanging = {key.decode() for key in HANGING}
    try:
        async with running(first):
            await until(
                lambda: {c.key for c in ledger.of("first")} >= hanging,
                60,
                "both hanging keys in their first call",
            )
            async with running(member("second")):
                await until(lambda: first.consumer.stuck_calls(), 60, "a key held")
                held = {call.hashed for call in first.consumer.stuck_calls()}
                assert len(held) == 1
            await until(
                lambda: first.consumer.assignment().get(tp) == [KeyRange.full()],
                60,
                "the whole range granted back, the held key with it",
            )
            # Processed and not committed yet when the hold ends.
            processed = len(ledger.of("first"))
            await produce(kafka_bootstrap, topic, list(FAST))
            await until(
                lambda: len(ledger.of("first")) >= processed + len(FAST), 60, "more records"
            )
            hangs.first.set()
            await until(lambda: len(hangs.seconds) == len(HANGING), 60, "both keys hanging again")
            # The hold ended on a key the member owns again: nothing of it is released, and
            # records handed out under the new grant are the member's to mark (nothing
            # forgets them).
            releasing = first.consumer._ownership.releasing
            await until(lambda: not releasing._holds, 30, "the old hold to end")
            assert not client_log.saying("held keys released")
            for record in hangs.seconds.values():
                assert first.consumer._handed.holds(record), record.offset
            third = member("third")
            async with running(third):
                await until(lambda: third.consumer.assignment(), 60, "the third member to join")
                await produce(kafka_bootstrap, topic, list(FAST))
                await until(
                    lambda: len(ledger.of("third")) >= len(FAST) // 4,
                    60,
                    "the third member to process its half meanwhile",
                )
                # It has not started the hanging key while the first member's call runs: the
                # first member holds it again.
                assert not hanging & {c.key for c in ledger.of("third")}
                assert ledger.overlaps() == []
                assert first.consumer.stuck_calls()
                assert len(client_log.saying("holds its key")) >= 2
                hangs.second.set()
                await until(lambda: not first.consumer.stuck_calls(), 60, "the hold to end")
    finally:
        hangs.release()
    assert ledger.overlaps() == []


async def test_the_gate_sees_a_call_in_a_pool_process_until_its_process_says_it_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release asks the gate what still runs, on every pool: a record sent to a child is
    in the gate until its outcome is back or its process is gone; a queued one a stop made
    sure never starts leaves it at once."""
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", "30")
    gate = granted_gate(lambda: time.monotonic() + 60)
    pool = ProcessPool(1, gate)
    slots = [Slot(), Slot()]

    def running() -> list[int]:
        return sorted(call.offset for call in gate.running_in(None))

    try:
        both = asyncio.gather(
            *(
                sent(pool, worker_targets.notes_its_start, gate, offset, slots[offset])
                for offset in (0, 1)
            ),
            return_exceptions=True,
        )
        await until(lambda: 0 in dict(starts(journal)), 30, "offset 0 running in the child")
        # The running call and the one behind it in the child's pipe.
        assert running() == [0, 1]
        assert slots[1].stop is not None and slots[0].stop is not None
        slots[1].stop()
        assert running() == [0]
        slots[0].stop()
        assert running() == [0], "killed, but not gone yet"
        await pool.until_stopped()
        outcomes = await asyncio.wait_for(both, 30)
        assert running() == []
    finally:
        pool.close()
    assert [type(outcome).__name__ for outcome in outcomes] == ["Stopped", "NotStarted"]
