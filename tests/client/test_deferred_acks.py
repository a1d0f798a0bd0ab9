"""Issue 46 item 3 (review finding M1): deferred acknowledgements are inside the gate. The
task form's first example in docs/workers.md acknowledges after ``process`` returned
(``asyncio.create_task(self.bill(record, observer))``); its key stays held from hand-out until
the acknowledgement, through a revocation and a processing timeout, as a thread call still
running does: no heir and no retry starts the key while the bill is pending.

Members run against the real broker and coordinator; a ledger notes each record's start (its
``process``) and end (its acknowledgement)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from client import key_hash
from client.worker import RecordObserver, Worker, WorkerTask
from tests.client.test_consumer import produce
from tests.client.test_release import Ledger
from tests.client.test_worker import config, group, processed_offsets, running
from tests.e2e.harness import allow_range_fetch
from tests.fixtures.services import MakeTopic
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.db]

_CANDIDATES = [b"bill-%d" % index for index in range(100)]
# One slow key in each half of the key space: whichever half the heir takes, one moves.
SLOW = [
    next(k for k in _CANDIDATES if key_hash(k, 0) < 2**62),
    next(k for k in _CANDIDATES if key_hash(k, 0) >= 2**62),
]
FAST = [b"fast-%d" % index for index in range(16)]


def billing(ledger: Ledger, name: str, *, slow_s: float) -> type[WorkerTask]:
    """The task of docs/workers.md's first example: ``process`` starts the bill and returns;
    the bill acknowledges later. On member "first", the first bill of a slow key takes
    ``slow_s`` seconds."""
    bills: set[asyncio.Task[None]] = set()

    class Billing(WorkerTask):
        async def process(self, record: Any, observer: RecordObserver) -> None:
            call = ledger.start(name, record)
            slow = name == "first" and record.key in SLOW and record.offset < len(SLOW)
            bill = asyncio.create_task(self.bill(call, observer, slow_s if slow else 0.0))
            bills.add(bill)
            bill.add_done_callback(bills.discard)

        async def bill(self, call: Any, observer: RecordObserver, seconds: float) -> None:
            await asyncio.sleep(seconds)
            call.end = time.time()
            observer.success()

    return Billing


async def test_a_deferred_acknowledgement_holds_its_key_past_the_drain_until_it_comes(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await allow_range_fetch(coordinator_url, topic)
    keys = [*SLOW, *FAST, *SLOW, *FAST]
    await produce(kafka_bootstrap, topic, keys)
    group_id = group()
    ledger = Ledger()
    settings = {"drain_timeout_s": 1.0, "subpartitions": 8}

    def member(name: str) -> Worker:
        return Worker(
            config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
            task=billing(ledger, name, slow_s=5.0),
        )

    first = member("first")
    slow = {key.decode() for key in SLOW}
    async with running(first):
        await until(lambda: {c.key for c in ledger.of("first")} >= slow, 60, "both bills pending")
        await asyncio.sleep(0.5)
        async with running(member("second")):
            await until(
                lambda: slow & {c.key for c in ledger.of("second")},
                60,
                "the heir to bill the held key once the first bill acknowledged",
            )

            async def committed() -> bool:
                return len(await processed_offsets(coordinator_url, group_id, topic, keys)) == len(
                    keys
                )

            await until(committed, 60, "everything committed")
    assert ledger.overlaps() == []


async def test_a_processing_timeout_does_not_retry_a_record_whose_acknowledgement_is_pending(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, [SLOW[0]])
    calls: list[tuple[float, float | None]] = []
    answers = iter([RuntimeError("the bill failed"), None])
    bills: set[asyncio.Task[None]] = set()

    class FailsLate(WorkerTask):
        async def process(self, record: Any, observer: RecordObserver) -> None:
            calls.append((time.time(), None))
            bill = asyncio.create_task(self.bill(len(calls) - 1, observer))
            bills.add(bill)
            bill.add_done_callback(bills.discard)

        async def bill(self, index: int, observer: RecordObserver) -> None:
            await asyncio.sleep(2.0 if index == 0 else 0.0)
            calls[index] = (calls[index][0], time.time())
            error = next(answers)
            if error is None:
                observer.success()
            else:
                observer.failure(error)

    worker = Worker(
        config(
            topic,
            kafka_bootstrap,
            coordinator_url,
            group(),
            processing_timeout_s=0.3,
            failure_policy="retry",
            max_attempts=3,
            retry_backoff_s=0.05,
            dead_letter_topic=f"{topic}-dlt",
        ),
        task=FailsLate,
    )
    async with running(worker):
        await until(lambda: worker.stats.processed == 1, 60, "the second attempt to succeed")
    # The timeouts passed while the first bill was pending: no attempt started before it
    # acknowledged, and nothing went to the dead-letter topic.
    assert len(calls) == 2
    first_end = calls[0][1]
    assert first_end is not None and first_end <= calls[1][0]
    assert worker.stats.dead_lettered == 0 and worker.stats.retried == 1


async def test_a_stop_waits_for_a_deferred_acknowledgement_before_the_heir_gets_its_key(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await allow_range_fetch(coordinator_url, topic)
    group_id = group()
    ledger = Ledger()
    settings = {"drain_timeout_s": 1.0, "subpartitions": 8}

    def member(name: str) -> Worker:
        return Worker(
            config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
            task=billing(ledger, name, slow_s=4.0),
        )

    first, second = member("first"), member("second")
    slow = {key.decode() for key in SLOW}
    async with running(second):
        first_run = asyncio.create_task(first.run())
        try:
            await until(
                lambda: first.consumer.assignment() and second.consumer.assignment(),
                60,
                "both members to own a half",
            )
            await produce(kafka_bootstrap, topic, [*SLOW, *FAST])
            await until(lambda: slow & {c.key for c in ledger.of("first")}, 60, "a bill pending")
            first.stop()
            await asyncio.wait_for(first_run, 60)
        finally:
            first.stop()
            await asyncio.gather(first_run, return_exceptions=True)
        await until(
            lambda: slow <= {c.key for c in ledger.of("second")},
            60,
            "the heir to bill the stopped member's key",
        )
    # The stop waited for the pending bill: the heir billed its key only afterwards.
    assert ledger.overlaps() == []
