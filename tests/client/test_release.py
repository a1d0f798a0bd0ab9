"""docs/design.md §5, "release means nothing of it runs", in every runtime (issue 27 items
1-3 and 7): a member gives a slice up, or leaves, only once no call of its keys runs. Calls
that can be stopped are stopped first (a loop call cancelled, a process killed); a thread
call that cannot be keeps only its own key until it ends, and the heir gets the rest at
once. Records queued in a pool do not start once their slice is revoked or the member stops.

Two members run against the real broker and coordinator: "first", whose calls on keys named
``slow-*`` outlive every timeout, and "second", which joins and takes half of the key space
(or outlives a shutdown of "first"). A ledger notes when each call of each member started and
ended (wall clock, one clock for the test's processes), and the test asserts that no key ran
on two members at once, that nothing started after its release, and that nothing was lost."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka.structs import TopicPartition

from client import KeyrangeConsumer, key_hash
from client.worker import Worker
from client.worker.metrics import worker_families
from tests.client import worker_targets
from tests.client.test_consumer import produce
from tests.client.test_worker import config, group, processed_offsets, running
from tests.e2e.harness import allow_range_fetch
from tests.fixtures.services import MakeTopic
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.db]

# Four slow keys in each half of the key space, so whichever half the second member takes,
# four of them move.
_CANDIDATES = [b"slow-%d" % index for index in range(100)]
SLOW = [k for k in _CANDIDATES if key_hash(k, 0) < 2**62][:4] + [
    k for k in _CANDIDATES if key_hash(k, 0) >= 2**62
][:4]
FAST = [b"fast-%d" % index for index in range(24)]
ROUND = SLOW + FAST
KEYS = ROUND * 4
# The offsets of the first round: the calls on slow keys that stick are these.
FIRST_ROUND = len(ROUND)


@dataclass
class Call:
    member: str
    key: str
    offset: int
    start: float
    end: float | None = None
    pid: int | None = None


class Ledger:
    """Every call's start and end, from handlers on the loop, on threads, or (through a
    journal file) in pool processes."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def start(self, member: str, record: Any) -> Call:
        call = Call(member, record.key.decode(), record.offset, time.time())
        with self._lock:
            self.calls.append(call)
        return call

    def read_journal(self, journal: Path) -> None:
        """The calls of pool processes, from ``worker_targets``' ledger lines."""
        calls: dict[tuple[str, int, str], Call] = {}
        ordered: list[Call] = []
        if journal.exists():
            for line in journal.read_text().splitlines():
                event, member, key, offset, at = line.split()
                ident = (member, int(offset), key)
                if event == "start":
                    calls[ident] = Call(member, key, int(offset), float(at))
                    ordered.append(calls[ident])
                else:
                    calls[ident].end = float(at)
        self.calls = ordered

    def of(self, member: str) -> list[Call]:
        with self._lock:
            return [call for call in self.calls if call.member == member]

    def overlaps(self, ended_by: dict[str, float] | None = None) -> list[tuple[Call, Call]]:
        """Pairs of calls of one key on two members whose times intersect; a call with no
        end runs on until ``ended_by[member]`` (when its process was killed) or for ever."""
        by_key: dict[str, list[Call]] = defaultdict(list)
        with self._lock:
            for call in self.calls:
                by_key[call.key].append(call)
        found = []
        for calls in by_key.values():
            for left in calls:
                for right in calls:
                    if left.member >= right.member:
                        continue
                    left_end = _end(left, ended_by)
                    right_end = _end(right, ended_by)
                    if left.start < right_end and right.start < left_end:
                        found.append((left, right))
        return found


def _end(call: Call, ended_by: dict[str, float] | None) -> float:
    if call.end is not None:
        return call.end
    return (ended_by or {}).get(call.member, float("inf"))


class Warnings(logging.Handler):
    """Log records of the client, for what the runtimes say about stuck and stopped calls."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def saying(self, text: str) -> list[logging.LogRecord]:
        return [record for record in self.records if text in record.getMessage()]


@pytest.fixture
def client_log() -> Any:
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


async def topic_with_keys(kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic) -> str:
    topic = await make_topic(1)
    await allow_range_fetch(coordinator_url, topic)
    await produce(kafka_bootstrap, topic, list(KEYS))
    return topic


def all_committed(
    coordinator: str, group_id: str, topic: str, keys: list[bytes]
) -> Callable[[], Any]:
    async def check() -> bool:
        done = await processed_offsets(coordinator, group_id, topic, keys)
        return len(done) == len(keys)

    return check


def sticks(record: Any) -> bool:
    return record.key in SLOW and record.offset < FIRST_ROUND


def sticking_on_a_thread(
    ledger: Ledger, release: threading.Event, name: str
) -> Callable[[Any], None]:
    """A plain handler (run on a pool thread) for member ``name``: the first member's calls
    on slow keys wait for ``release``, which no timeout of the test outlasts."""

    def handle(record: Any) -> None:
        call = ledger.start(name, record)
        if name == "first" and sticks(record):
            release.wait(120)
        call.end = time.time()

    return handle


async def test_run_cancels_handlers_past_the_revoke_timeout_before_the_heir_starts_their_keys(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await topic_with_keys(kafka_bootstrap, coordinator_url, make_topic)
    group_id = group()
    ledger = Ledger()
    cancelled: list[str] = []

    def member(name: str) -> tuple[KeyrangeConsumer, Callable[[Any], Any]]:
        consumer = KeyrangeConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=coordinator_url,
            group_id=group_id,
            session_timeout_ms=3_000,
            auto_commit_interval_ms=200,
            revoke_timeout_s=1.0,
        )

        async def handle(record: Any) -> None:
            call = ledger.start(name, record)
            try:
                if name == "first" and sticks(record):
                    await asyncio.sleep(120)
            except asyncio.CancelledError:
                cancelled.append(call.key)
                raise
            finally:
                call.end = time.time()

        return consumer, handle

    first, first_handle = member("first")
    second, second_handle = member("second")
    async with first:
        first_run = asyncio.create_task(first.run(first_handle, max_concurrency=40))
        await until(lambda: len(ledger.of("first")) >= FIRST_ROUND, 60, "every key started")
        async with second:
            second_run = asyncio.create_task(second.run(second_handle, max_concurrency=40))
            await until(lambda: cancelled, 60, "a stuck handler of a revoked slice cancelled")
            await until(
                lambda: {c.key for c in ledger.of("second")} >= set(cancelled),
                60,
                "the heir to run the cancelled handlers' keys",
            )
            revoked = set(cancelled)
            moved = {key.decode() for key in SLOW} & {c.key for c in ledger.of("second")}
            for task in (first_run, second_run):
                task.cancel()
    # Exactly the stuck handlers of the revoked half were cancelled, and nothing else.
    assert revoked == moved
    assert ledger.overlaps() == []


async def test_a_thread_call_past_the_drain_timeout_holds_only_its_key_until_it_ends(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, client_log: Warnings
) -> None:
    topic = await topic_with_keys(kafka_bootstrap, coordinator_url, make_topic)
    tp = TopicPartition(topic, 0)
    group_id = group()
    ledger = Ledger()
    release = threading.Event()

    def handler(name: str) -> Callable[[Any], None]:
        return sticking_on_a_thread(ledger, release, name)

    settings = {"drain_timeout_s": 1.0, "max_concurrency": 40, "worker_threads": 40}
    first = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
        handler=handler("first"),
    )
    second = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
        handler=handler("second"),
    )
    try:
        async with running(first):
            await until(
                lambda: sum(1 for c in ledger.of("first") if c.end is not None) >= 96,
                60,
                "the fast keys processed, the slow ones stuck",
            )
            async with running(second):
                await until(lambda: first.consumer.stuck_calls(), 60, "calls holding keys")
                await until(
                    lambda: tp in second.consumer.assignment(), 30, "the heir to own the rest"
                )
                held = {call.hashed for call in first.consumer.stuck_calls()}
                owned = second.consumer.assignment()[tp]
                # The heir owns its half but the stuck keys' hashes, at once.
                assert held and not any(r.contains(h) for r in owned for h in held)
                assert any(r.contains(h + 1) or r.contains(h - 1) for r in owned for h in held)
                # It processes new records of its keys meanwhile.
                await produce(kafka_bootstrap, topic, list(FAST))
                await until(lambda: ledger.of("second"), 60, "the heir to process meanwhile")
                assert first.consumer.stuck_calls()
                gauges = {
                    family.name: family.samples[0][1]
                    for family in worker_families(first.runtime, first.consumer.stuck_calls(), 0)
                    if family.name.startswith("keyrange_worker_stuck")
                }
                assert gauges["keyrange_worker_stuck_calls"] == len(held)
                assert gauges["keyrange_worker_stuck_call_max_seconds"] > 1.0

                async def reported() -> set[int]:
                    async with httpx.AsyncClient(base_url=coordinator_url) as api:
                        reply = await api.get(f"/v1/admin/groups/{group_id}")
                    return {
                        call["key_hash"]
                        for member in reply.json()["members"]
                        for call in member["stuck"]
                    }

                async def shown() -> bool:
                    return await reported() == held

                await until(shown, 30, "the coordinator to show the stuck calls")
                named = client_log.saying("a call that cannot be stopped holds its key")
                assert {record.key_hash for record in named} == held  # type: ignore[attr-defined]
                assert all(r.group_id == group_id for r in named)  # type: ignore[attr-defined]
                stuck_keys = {key.decode() for key in SLOW if key_hash(key, 0) in held}
                assert not stuck_keys & {c.key for c in ledger.of("second")}
                release.set()
                await until(
                    lambda: stuck_keys <= {c.key for c in ledger.of("second")},
                    60,
                    "the heir to run the held keys once their calls ended",
                )
                await until(
                    all_committed(coordinator_url, group_id, topic, KEYS + FAST),
                    60,
                    "everything committed",
                )

                async def cleared() -> bool:
                    return await reported() == set()

                await until(cleared, 30, "the coordinator to clear the stuck calls")
    finally:
        release.set()
    assert not first.consumer.stuck_calls()
    assert ledger.overlaps() == []


async def test_a_process_call_past_the_drain_timeout_is_killed_before_the_heir_starts_its_key(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    client_log: Warnings,
) -> None:
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", "120")
    monkeypatch.setenv("WORKER_TEST_FIRST_N", str(FIRST_ROUND))
    topic = await topic_with_keys(kafka_bootstrap, coordinator_url, make_topic)
    group_id = group()
    ledger = Ledger()
    # A process and a batch of one record for each slow key: every one of them runs.
    settings = {"drain_timeout_s": 1.0, "max_concurrency": len(SLOW), "processes": len(SLOW)}
    first = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
        handler=worker_targets.slow_keys_stick_on_first,
    )
    second = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
        handler=worker_targets.never_sticks,
    )
    slow = {key.decode() for key in SLOW}

    def started(member: str) -> set[str]:
        ledger.read_journal(journal)
        return {call.key for call in ledger.of(member)}

    async with running(first):
        await until(lambda: started("first") >= slow, 60, "every slow key stuck in a process")
        async with running(second):
            await until(
                lambda: len(started("second") & slow) == len(SLOW) // 2,
                90,
                "the heir to run the slow keys of its half",
            )
            kills = client_log.saying("killed to end a call has exited")
    ledger.read_journal(journal)
    assert len(kills) == len(SLOW) // 2
    # A killed call ran until its process had exited, which was before the release.
    assert ledger.overlaps({"first": max(record.created for record in kills)}) == []


@pytest.mark.parametrize("policy", ["retry", "skip"])
async def test_a_timed_out_thread_call_keeps_its_key_and_its_record_until_it_ends(
    policy: str, kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await topic_with_keys(kafka_bootstrap, coordinator_url, make_topic)
    group_id = group()
    ledger = Ledger()
    release = threading.Event()

    def handler(name: str) -> Callable[[Any], None]:
        return sticking_on_a_thread(ledger, release, name)

    settings = {
        "drain_timeout_s": 1.0,
        "processing_timeout_s": 1.0,
        "max_concurrency": 40,
        "worker_threads": 40,
        "failure_policy": policy,
        "retry_backoff_s": 0.05,
        "dead_letter_topic": f"{topic}-dlt",
    }
    first = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
        handler=handler("first"),
    )
    second = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
        handler=handler("second"),
    )
    slow_offsets = set(range(len(SLOW)))
    try:
        async with running(first):
            await until(
                lambda: sum(1 for c in ledger.of("first") if c.end is not None) >= 96,
                60,
                "the fast keys processed, the slow ones past their timeout",
            )
            await until(
                lambda: first.stats.failed >= 0 and len(first.consumer.gate.running_in(None)) == 8,
                30,
                "eight calls past the processing timeout",
            )
            # Not tried again, no next record of their keys, not counted as processed.
            assert len(ledger.of("first")) == 96 + len(SLOW)
            assert not slow_offsets & await processed_offsets(
                coordinator_url, group_id, topic, KEYS
            )
            async with running(second):
                await until(lambda: first.consumer.stuck_calls(), 60, "calls holding keys")
                release.set()
                await until(
                    all_committed(coordinator_url, group_id, topic, KEYS),
                    60,
                    "everything committed",
                )
    finally:
        release.set()
    assert ledger.overlaps() == []
    for key in SLOW:
        calls = sorted(
            (c for c in ledger.calls if c.key == key.decode()), key=lambda call: call.start
        )
        for earlier, later in itertools.pairwise(calls):
            assert earlier.end is not None and earlier.end <= later.start, key


@pytest.mark.parametrize("pool", ["threads", "processes"])
async def test_a_shutdown_starts_nothing_queued_and_leaves_once_its_calls_ended(
    pool: str,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", "4")
    monkeypatch.setenv("WORKER_TEST_FIRST_N", str(FIRST_ROUND))
    topic = await make_topic(1)
    await allow_range_fetch(coordinator_url, topic)
    group_id = group()
    ledger = Ledger()
    on_threads = pool == "threads"
    settings: dict[str, Any] = {"drain_timeout_s": 1.0, "max_concurrency": 40}
    settings.update({"worker_threads": 2} if on_threads else {"processes": 1})
    first = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
        handler=worker_targets.slow_keys_stick_on_first,
    )
    second = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **settings),
        handler=worker_targets.never_sticks,
    )

    def calls(member: str) -> list[Call]:
        ledger.read_journal(journal)
        return ledger.of(member)

    async with running(second):
        first_run = asyncio.create_task(first.run())
        try:
            # The records come once both members own their half, so the first has slow keys.
            await until(
                lambda: first.consumer.assignment() and second.consumer.assignment(),
                60,
                "both members to own a half",
            )
            await produce(kafka_bootstrap, topic, list(KEYS))
            busy = 2 if on_threads else 1
            await until(
                lambda: len([c for c in calls("first") if c.end is None]) == busy,
                60,
                "the first member's pool busy with stuck calls, more records queued",
            )
            stopped_at = time.time()
            first.stop()
            await asyncio.wait_for(first_run, 60)
        finally:
            first.stop()
            await asyncio.gather(first_run, return_exceptions=True)
        left_at = time.time()
        await until(
            all_committed(coordinator_url, group_id, topic, KEYS), 60, "everything committed"
        )
    late = [c for c in calls("first") if c.start > stopped_at]
    assert late == [], "records started after the stop"
    if on_threads:
        # Thread calls cannot be stopped: the member left only once they had ended.
        assert all(c.end is not None and c.end <= left_at for c in calls("first"))
        assert ledger.overlaps() == []
    else:
        # The process running a stuck call was killed before the member left.
        assert ledger.overlaps({"first": left_at}) == []
