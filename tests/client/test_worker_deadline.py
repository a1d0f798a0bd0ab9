"""docs/design.md §5, the client half, where the worker's pools queue records: a record handed out
before the session deadline can still wait for a pool thread, or sit in a child process's
pipe behind the batch it works on, when the deadline passes. None of them may start after it
(the coordinator may have given its key away by then) until the member has rejoined, and
none is lost: the member processes them once it has the slice again.

The event loop is blocked from the test, as a synchronous call on it or a frozen process
would block it; the coordinator here shares that loop, so it stalls too and reaps the member
after. The pools' own checks are tested without Kafka, against a deadline the test moves, and what
the runtime makes of a record a pool did not start over an in-memory source."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

from client.protocol.keyspace import KeyRange
from client.runtime.gate import OwnershipGate
from client.runtime.pools.pool import NotStarted, RecordClaim
from client.runtime.pools.processes import ProcessPool
from client.worker import Worker
from client.worker.calls import Calls
from client.worker.lanes import Attempt, Lane
from client.worker.runtime import WorkerRuntime
from client.worker.task import WorkerTask
from tests.client import worker_targets
from tests.client.in_memory_source import InMemorySource
from tests.client.test_consumer import produce
from tests.client.test_worker import config, group, processed_offsets, running
from tests.fixtures.services import MakeTopic
from tests.waiting import until

SESSION_MS = 2_000


class EpochLog(logging.Handler):
    """When each member id got a new epoch, on the monotonic clock: the membership logs it as
    it takes in the heartbeat's reply, so a rejoin is timed to the instant."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.epochs: list[tuple[float, str | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "member epoch changed":
            self.epochs.append((time.monotonic(), getattr(record, "member_id", None)))


def journal_lines(journal: Path) -> list[list[str]]:
    if not journal.exists():
        return []
    return [line.split() for line in journal.read_text().split("\n")[:-1]]


def starts(journal: Path) -> list[tuple[int, float]]:
    """(offset, monotonic instant) of each start of a record in user code."""
    return [(int(line[1]), float(line[2])) for line in journal_lines(journal) if line[0] == "start"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pool", "records", "sleep_s"),
    [
        # Each process has about a dozen records of 0.3 s waiting in its pipe.
        pytest.param({"processes": 2, "max_concurrency": 24}, 60, 0.3, id="processes"),
        # Fifteen calls of 0.25 s wait for the one thread.
        pytest.param({"worker_threads": 1, "max_concurrency": 16}, 40, 0.25, id="threads"),
    ],
)
async def test_records_queued_in_a_pool_do_not_start_past_the_session_deadline(
    pool: dict[str, Any],
    records: int,
    sleep_s: float,
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await make_topic(1)
    # A key per record: each is its own lane, so max_concurrency records are out at once.
    keys = [b"key-%d" % index for index in range(records)]
    await produce(kafka_bootstrap, topic, keys)
    group_id = group()
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", str(sleep_s))
    session_s = SESSION_MS / 1000
    caplog.set_level(logging.INFO, logger="client.membership")
    epoch_log = EpochLog()
    logging.getLogger("client.membership").addHandler(epoch_log)
    worker = Worker(
        config(
            topic, kafka_bootstrap, coordinator_url, group_id, session_timeout_ms=SESSION_MS, **pool
        ),
        handler=worker_targets.notes_its_start,
    )
    blocked: list[float] = []
    in_flight: list[int] = []

    def block_the_loop() -> None:
        assert worker.runtime is not None
        in_flight.append(worker.runtime.in_flight)
        blocked.append(time.monotonic())
        time.sleep(session_s + 1)
        blocked.append(time.monotonic())

    async def all_processed() -> bool:
        done = await processed_offsets(coordinator_url, group_id, topic, keys)
        return len(done) == records

    try:
        async with running(worker):
            await until(lambda: len(starts(journal)) >= 2, 60, "records flowing")
            first_member = worker.consumer.member_id
            asyncio.get_running_loop().call_soon(block_the_loop)
            await until(lambda: len(blocked) == 2, 30, "the loop blocked past the session")
            await until(all_processed, 60, "every record processed after the rejoin")
    finally:
        logging.getLogger("client.membership").removeHandler(epoch_log)
    blocked_at, _ = blocked
    workers = pool.get("processes") or pool["worker_threads"]
    # The premise: more records were out than the pool could start before the deadline.
    assert in_flight[0] > workers * (session_s / sleep_s + 1), in_flight
    rejoins = [at for at, member in epoch_log.epochs if at > blocked_at and member != first_member]
    assert rejoins, "the member did not rejoin under a new member id"
    # The member's deadline is at most a session after the block began: its last
    # successful heartbeat was sent before.
    latest_deadline = blocked_at + session_s
    late = [
        (offset, round(at - blocked_at, 3))
        for offset, at in starts(journal)
        if latest_deadline <= at < rejoins[0]
    ]
    assert late == [], "records started past the session deadline (offset, s after the block)"
    # A record not started is no failure (at_least_once would have stopped the worker).
    assert worker.stats.failed == 0
    # Nothing lost: every record ran to its end, the refused ones after the rejoin.
    done = {int(line[1]) for line in journal_lines(journal) if line[0] == "done"}
    assert done == set(range(records))


TP = TopicPartition("orders", 0)


def record(offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("orders", 0, offset, 0, 0, b"key", b"value", None, 3, 5, [])


class Deadline:
    """A session deadline the test moves, as heartbeats and a loss would move it."""

    def __init__(self) -> None:
        self.at = time.monotonic() + 60

    def passed(self) -> None:
        self.at = time.monotonic() - 1

    def ahead(self, seconds: float = 60) -> None:
        self.at = time.monotonic() + seconds

    def __call__(self) -> float:
        return self.at


@pytest.mark.slow
async def test_a_pool_process_starts_a_record_only_before_the_shared_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", "0.5")
    session = Deadline()
    gate = granted_gate(session)
    pool = ProcessPool(1, gate)

    def run(offset: int) -> Any:
        return sent(pool, worker_targets.notes_its_start, gate, offset, Slot())

    try:
        await run(0)
        session.passed()
        with pytest.raises(NotStarted):
            await run(1)
        session.ahead()
        # The deadline passes while offset 3 waits in the pipe: the pool copies it there.
        both = asyncio.gather(run(2), run(3), return_exceptions=True)
        await until(lambda: 2 in dict(starts(journal)), 30, "offset 2 started")
        session.passed()
        second = await both
        session.ahead()
        # The membership ends while offset 5 waits, and the member rejoins at once: the
        # new membership's deadline lies ahead, but offset 5 was handed out under the old.
        both = asyncio.gather(run(4), run(5), return_exceptions=True)
        await until(lambda: 4 in dict(starts(journal)), 30, "offset 4 started")
        gate.end()
        gate.grant({TP: [KeyRange.full()]})
        third = await both
    finally:
        pool.close()
    assert second[0] is None and isinstance(second[1], NotStarted)
    assert third[0] is None and isinstance(third[1], NotStarted)
    assert [offset for offset, _ in starts(journal)] == [0, 2, 4]


@pytest.mark.slow
async def test_a_process_working_through_long_batches_is_not_refused_while_the_session_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The membership moves the deadline on with each heartbeat; the children's copy must
    follow while they work, not only when a batch goes out."""
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", "0.2")
    # A session of 0.5 s that heartbeats without pause: always half a second ahead.
    gate = granted_gate(lambda: time.monotonic() + 0.5)
    pool = ProcessPool(1, gate)
    try:
        # Eight records of 0.2 s in the one process's pipe at once: 1.6 s of work.
        outcomes = await asyncio.gather(
            *(
                sent(pool, worker_targets.notes_its_start, gate, offset, Slot())
                for offset in range(8)
            ),
            return_exceptions=True,
        )
    finally:
        pool.close()
    assert outcomes == [None] * 8
    assert [offset for offset, _ in starts(journal)] == list(range(8))


async def test_a_call_waiting_for_a_pool_thread_starts_only_before_the_deadline() -> None:
    session = Deadline()
    gate = granted_gate(session)
    calls = Calls(threads=1, processes=0, gate=gate)
    ran: list[int] = []
    release = threading.Event()

    def hold(offset: int) -> None:
        ran.append(offset)
        release.wait(30)

    async def behind_a_busy_thread(
        offset: int, then: Callable[[], None]
    ) -> list[BaseException | None]:
        """``offset`` runs and holds the one thread; ``offset + 1`` waits for it while
        ``then`` happens."""
        release.clear()
        holding = calls.for_record(attempt(offset, gate), hold, offset)
        waiting = calls.for_record(attempt(offset + 1, gate), ran.append, offset + 1)
        both = asyncio.gather(holding, waiting, return_exceptions=True)
        await until(lambda: offset in ran, 30, f"offset {offset} holds the thread")
        then()
        release.set()
        return await both

    try:
        await calls.for_record(attempt(0, gate), ran.append, 0)
        session.passed()
        with pytest.raises(NotStarted):
            await calls.for_record(attempt(1, gate), ran.append, 1)
        session.ahead()
        passed = await behind_a_busy_thread(2, session.passed)
        session.ahead()

        def lost_and_rejoined() -> None:
            # The new membership's deadline lies ahead; its leases are new.
            gate.end()
            gate.grant({TP: [KeyRange.full()]})

        ended = await behind_a_busy_thread(4, lost_and_rejoined)
    finally:
        release.set()
        calls.close()
    assert passed[0] is None and isinstance(passed[1], NotStarted)
    assert ended[0] is None and isinstance(ended[1], NotStarted)
    assert ran == [0, 2, 4]


class Slot:
    stop: Callable[[], None] | None = None


def sent(
    pool: ProcessPool, handler: Callable[[Any], None], gate: OwnershipGate, offset: int, slot: Slot
) -> Awaitable[None]:
    """``handler`` on the record at ``offset``, in the pool, under its lease."""
    claim = RecordClaim(gate.lease(TP, offset), TP, offset, offset)
    return pool.run(claim, slot, handler, record(offset))


def granted_gate(session: Callable[[], float]) -> OwnershipGate:
    gate = OwnershipGate(session)
    gate.grant({TP: [KeyRange.full()]})
    return gate


def attempt(offset: int, gate: OwnershipGate) -> Attempt:
    lane = Lane((TP, offset), WorkerTask())
    return Attempt((TP, record(offset), offset), lane, 0, gate.lease(TP, offset))


class Source(InMemorySource):
    """An in-memory ``WorkerSource``: records put in by the test, a session deadline it
    moves, and a hand-out guard that loses the membership (once) when asked past it."""

    def __init__(self) -> None:
        super().__init__()
        self.deadline_at = time.monotonic() + 60
        # Readings of the deadline still to give an instant already past, as a copy that
        # lagged behind the heartbeats would.
        self.lagging = 0
        self.runtime: WorkerRuntime | None = None
        self.lost = False
        # The active slices, as the runtime reads them when told of an ownership change.
        self.owned: list[tuple[TopicPartition, KeyRange, int]] = []

    def put(self, offset: int) -> None:
        self.items.put_nowait((TP, record(offset), offset))

    def may_hand_out(self) -> bool:
        if not self.lost and time.monotonic() >= self.deadline_at:
            self.lost = True
            assert self.runtime is not None
            self.gate.end()
            self.runtime.lost({})
        return not self.lost

    def session_deadline(self) -> float:
        if self.lost:
            return float("-inf")
        if self.lagging:
            self.lagging -= 1
            return time.monotonic() - 1
        return self.deadline_at

    def pause(self, partitions: list[TopicPartition]) -> None:
        pass

    def resume(self, partitions: list[TopicPartition]) -> None:
        pass

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    def slice_watermarks(self) -> list[Any]:
        return self.owned


@asynccontextmanager
async def runtime_over(
    source: Source, handler: Callable[[Any], None], **settings: Any
) -> AsyncIterator[tuple[WorkerRuntime, asyncio.Task[None]]]:
    """A handler-form runtime on a thread pool over ``source``, and its run (policy
    ``at_least_once``: a failure would end it)."""
    settings = {"max_concurrency": 2, "worker_threads": 1, **settings}
    calls = Calls(threads=settings["worker_threads"], processes=0, gate=source.gate)
    runtime = WorkerRuntime(
        source,
        config("orders", "unused:9092", "http://unused", "g", **settings),
        calls,
        handler_process=calls.handler_process(handler),
    )
    source.runtime = runtime
    running = asyncio.create_task(runtime.run())
    try:
        yield runtime, running
    finally:
        await runtime.stopping(5.0)
        await running
        calls.close()


async def test_a_record_a_pool_did_not_start_is_sent_again_while_the_membership_holds() -> None:
    source = Source()
    # The deadline the thread read had passed; a heartbeat answered since.
    source.lagging = 1
    ran: list[int] = []
    async with runtime_over(source, lambda record: ran.append(record.offset)) as (runtime, running):
        source.put(0)
        await until(lambda: source.marked == [0], 30, "the record processed")
        assert not running.done()
        assert source.lagging == 0
        stats = runtime.stats
        assert (stats.failed, stats.retried, stats.processed) == (0, 0, 1)
    assert ran == [0]
    assert source.given_back == []


@asynccontextmanager
async def offset_1_waiting_for_the_thread(
    source: Source,
) -> AsyncIterator[tuple[WorkerRuntime, asyncio.Task[None], list[int], threading.Event]]:
    """A runtime on one thread, running offset 0 until ``release`` is set, with offset 1
    handed out and waiting for that thread; ``ran`` lists the offsets handled so far."""
    ran: list[int] = []
    release = threading.Event()

    def handle(record: Any) -> None:
        ran.append(record.offset)
        if record.offset == 0:
            release.wait(30)

    try:
        async with runtime_over(source, handle) as (runtime, running):
            source.put(0)
            source.put(1)
            await until(lambda: ran == [0] and source.handed == [0, 1], 30, "1 waits for 0")
            yield runtime, running, ran, release
    finally:
        release.set()


async def test_a_record_a_pool_did_not_start_past_the_deadline_goes_back_with_the_loss() -> None:
    source = Source()
    async with offset_1_waiting_for_the_thread(source) as (runtime, running, ran, release):
        # The deadline passes while offset 1 waits for the thread, and nothing on the
        # loop has asked the hand-out guard since: the refusal is the first to know.
        source.deadline_at = time.monotonic() - 1
        release.set()
        await until(lambda: 1 in source.given_back, 30, "offset 1 given back")
        assert source.lost
        # Neither a failure (at_least_once would have stopped the runtime) nor processed.
        assert not running.done()
        assert runtime.stats.failed == 0
    assert ran == [0]
    assert 1 not in source.marked


async def test_a_record_a_partial_revocation_kept_is_sent_again_under_the_kept_lease() -> None:
    """A revocation of part of a slice ends the whole slice's lease: a record of the kept part
    waiting for the pool is refused, and must be sent again under the kept part's lease, not
    given back (which would leave it to this member's restart: lost while the member lives)."""
    source = Source()
    revoked = {TP: [KeyRange(1_000, KeyRange.full().end)]}
    async with offset_1_waiting_for_the_thread(source) as (runtime, running, ran, release):
        # What the consumer's release does: the gate first, then the runtime's hook.
        source.revoke(revoked)
        runtime.revoking(revoked)
        release.set()
        await until(lambda: source.marked == [0, 1], 30, "both processed")
        assert not running.done()
    assert ran == [0, 1]
    assert source.given_back == []


@pytest.mark.slow
async def test_records_a_dead_process_never_started_are_not_counted_as_its_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that dies fails the record it ran (and those it ran before it in the same
    batch, whose outcomes died with it); the ones queued behind it never ran, so they come
    back as not started, to be sent again without counting an attempt or being dead-lettered
    (issue 27 item 7)."""
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    gate = granted_gate(lambda: time.monotonic() + 60)
    pool = ProcessPool(1, gate)
    try:
        outcomes = await asyncio.gather(
            *(
                sent(pool, worker_targets.dies_at_offset_one, gate, offset, Slot())
                for offset in range(4)
            ),
            return_exceptions=True,
        )
    finally:
        pool.close()
    assert [type(outcome).__name__ for outcome in outcomes] == [
        "ProcessDied",
        "ProcessDied",
        "NotStarted",
        "NotStarted",
    ]
    assert [line[1] for line in journal_lines(journal)] == ["0", "1"]


@pytest.mark.slow
async def test_stopping_a_queued_process_call_skips_it_and_a_running_one_kills_its_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", "30")
    gate = granted_gate(lambda: time.monotonic() + 60)
    pool = ProcessPool(1, gate)
    slots = [Slot(), Slot()]
    try:
        both = asyncio.gather(
            *(
                sent(pool, worker_targets.notes_its_start, gate, offset, slots[offset])
                for offset in (0, 1)
            ),
            return_exceptions=True,
        )
        await until(lambda: 0 in dict(starts(journal)), 30, "offset 0 running")
        assert slots[1].stop is not None and slots[0].stop is not None
        slots[1].stop()
        slots[0].stop()
        outcomes = await asyncio.wait_for(both, 30)
        await pool.until_stopped()
    finally:
        pool.close()
    assert [type(outcome).__name__ for outcome in outcomes] == ["Stopped", "NotStarted"]
    assert [offset for offset, _ in starts(journal)] == [0]


@pytest.mark.slow
async def test_a_process_that_skipped_a_stopped_call_starts_the_records_sent_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop refuses what was in the child's pipe, not the child's future: a record sent
    to it afterwards, the stopped one sent again included, starts. (The refusal once
    outlived the stop, and a record sent back to the one idle child never ran.)"""
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", "0.5")
    gate = granted_gate(lambda: time.monotonic() + 60)
    pool = ProcessPool(1, gate)
    slots = [Slot(), Slot(), Slot()]
    try:
        both = asyncio.gather(
            *(
                sent(pool, worker_targets.notes_its_start, gate, offset, slots[offset])
                for offset in (0, 1, 2)
            ),
            return_exceptions=True,
        )
        await until(lambda: 0 in dict(starts(journal)), 30, "offset 0 running")
        assert slots[1].stop is not None
        slots[1].stop()
        first = await asyncio.wait_for(both, 30)
        again = await asyncio.wait_for(
            asyncio.gather(
                *(
                    sent(pool, worker_targets.notes_its_start, gate, offset, Slot())
                    for offset in (1, 3)
                ),
                return_exceptions=True,
            ),
            30,
        )
    finally:
        pool.close()
    assert [type(outcome).__name__ for outcome in first] == ["NoneType", "NotStarted", "NotStarted"]
    assert again == [None, None]
    assert [offset for offset, _ in starts(journal)] == [0, 1, 3]


async def test_a_sub_partition_never_has_two_tasks_at_once_when_its_partition_comes_back() -> None:
    """The partition is closed while its task is inside a call that outlives the drain
    timeout, and granted again at once: the new task starts only after the old one's call
    ended and it was closed (issue 27 item 7)."""
    source = Source()
    events: list[tuple[str, int]] = []
    release = threading.Event()
    instances = iter(range(100))

    class Blocking(WorkerTask):
        def init(self, subpartition: Any, config: Any) -> None:
            self.instance = next(instances)
            events.append(("init", self.instance))

        def process(self, record: Any, observer: Any) -> None:
            events.append(("process", self.instance))
            if record.offset == 0:
                release.wait(30)
            observer.success()

        def close(self) -> None:
            events.append(("close", self.instance))

    calls = Calls(threads=4, processes=0, gate=source.gate)
    runtime = WorkerRuntime(
        source,
        config("orders", "unused:9092", "http://unused", "g", drain_timeout_s=0.2),
        calls,
        task_factory=Blocking,
    )
    source.runtime = runtime
    running = asyncio.create_task(runtime.run())
    try:
        source.put(0)
        await until(lambda: ("process", 0) in events, 30, "the first task in its call")
        await runtime.revoked({TP: [KeyRange.full()]})
        source.owned = [(TP, KeyRange.full(), 0)]
        runtime.assigned({TP: [KeyRange.full()]})
        source.put(1)
        release.set()
        await until(lambda: source.marked == [0, 1], 30, "both records processed")
    finally:
        release.set()
        await runtime.stopping(5.0)
        await running
        calls.close()
    assert events[:4] == [("init", 0), ("process", 0), ("close", 0), ("init", 1)]
    assert ("process", 1) in events


@pytest.mark.slow
async def test_a_process_call_past_its_processing_timeout_is_killed_and_fails_as_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As on the loop: the call is ended (its process killed) and the policy sees the
    timeout, not how the pool ended the call (docs/workers.md)."""
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    monkeypatch.setenv("WORKER_TEST_SLEEP", "30")
    source = Source()
    calls = Calls(threads=1, processes=1, gate=source.gate)
    runtime = WorkerRuntime(
        source,
        config(
            "orders",
            "unused:9092",
            "http://unused",
            "g",
            processes=1,
            processing_timeout_s=0.5,
            failure_policy="skip",
        ),
        calls,
        handler_process=calls.handler_process(worker_targets.notes_its_start),
    )
    source.runtime = runtime
    running = asyncio.create_task(runtime.run())
    caplog.set_level(logging.WARNING, logger="client.worker.outcomes")
    try:
        source.put(0)
        await until(lambda: source.marked == [0], 20, "the record skipped after its timeout")
    finally:
        await runtime.stopping(5.0)
        await running
        calls.close()
    skipped = [r for r in caplog.records if r.getMessage() == "record failed; skipped"]
    assert [getattr(r, "error_type", None) for r in skipped] == ["ProcessingTimeout"]
    assert [line[0] for line in journal_lines(journal)] == ["start"]
