"""Cooperative members sharing one partition, end to end: the embedded broker, the embedded
Postgres, and the real coordinator app on a real port.

Each test prints what it measured (run with ``-s`` to see it): the peak stored IC state,
how many records were redelivered after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from aiokafka.structs import TopicPartition

from client import CommittedOffsets, CoordinatorClient, key_hash
from tests.e2e.harness import (
    SESSION_TIMEOUT_MS,
    Ledger,
    Member,
    StateObserver,
    allow_range_fetch,
    produce,
    unique,
    zipf_keys,
)
from tests.e2e.processes import WorkerProcess
from tests.fixtures.services import MakeTopic
from tests.waiting import until

pytestmark = pytest.mark.slow
# The coordinator's default max_ic_ranges_per_partition: past it a commit is refused and the
# group rebalanced, so stored state near it would disturb the group.
MAX_IC_RANGES_PER_PARTITION = 10_000


class WarningCounter(logging.Handler):
    """Client warnings and their ``error`` detail, to explain a failure after the fact."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: Counter[tuple[str, str]] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen[(record.getMessage(), str(getattr(record, "error", "")))] += 1


class Run:
    """One group over one fresh partition: members, the ledger, the state observer."""

    def __init__(self, bootstrap: str, coordinator: str, topic: str, keys: list[bytes]) -> None:
        self.bootstrap = bootstrap
        self.coordinator = coordinator
        self.topic = topic
        self.group = unique("e2e")
        self.ledger = Ledger(keys)
        self.observer = StateObserver(coordinator, self.group, topic)
        self.members: list[Member] = []
        self._observing: asyncio.Task[None] | None = None
        self.client_warnings = WarningCounter()
        logging.getLogger("client").addHandler(self.client_warnings)

    async def add(self, name: str, *, work_s: float = 0.0005, concurrency: int = 4) -> Member:
        member = Member(
            name,
            self.ledger,
            bootstrap=self.bootstrap,
            coordinator=self.coordinator,
            group=self.group,
            topic=self.topic,
            work_s=work_s,
            concurrency=concurrency,
        )
        self.members.append(member)
        return await member.start()

    def observe(self) -> None:
        self._observing = asyncio.create_task(self.observer.run())

    async def until_processed(self, count: int, timeout_s: float = 90) -> None:
        await until(
            lambda: len(self.ledger.processed()) >= count, timeout_s, f"{count} records processed"
        )

    async def until_stable_offset(self, offset: int, timeout_s: float = 30) -> None:
        await until(
            lambda: self.observer.stable_offset >= offset,
            timeout_s,
            f"stable offset {offset} (at {self.observer.stable_offset})",
        )

    async def close(self) -> None:
        await asyncio.gather(*(member.close() for member in self.members))
        if self._observing is not None:
            self._observing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._observing
        logging.getLogger("client").removeHandler(self.client_warnings)
        if self.client_warnings.seen:
            print(f"\nclient warnings in {self.group}:")
            for (message, error), count in self.client_warnings.seen.most_common():
                print(f"  {count:4d} x {message} ({error})")

    def lost_at(self) -> dict[str, list[float]]:
        return {member.name: member.lost_at for member in self.members}

    def check_members_kept_to_their_slices(self) -> None:
        for member in self.members:
            assert member.outside_assignment == [], (
                f"{member.name} processed records outside its slices"
            )


@pytest_asyncio.fixture(loop_scope="session")
async def new_run(
    kafka_bootstrap: str, coordinator: str, make_topic: MakeTopic
) -> AsyncIterator[Callable[..., Awaitable[Run]]]:
    runs: list[Run] = []

    async def make(keys: list[bytes], *, range_fetch: bool = True) -> Run:
        topic = await make_topic(1)
        if range_fetch:
            await allow_range_fetch(coordinator, topic)
        await produce(kafka_bootstrap, topic, keys)
        run = Run(kafka_bootstrap, coordinator, topic, keys)
        runs.append(run)
        return run

    yield make
    for run in runs:
        await run.close()


@pytest.mark.parametrize("concurrency", [0, 4], ids=["in-offset-order", "run-4-keys-at-once"])
async def test_four_members_share_a_skewed_partition_in_key_order_with_small_stored_state(
    new_run: Callable[..., Awaitable[Run]], concurrency: int
) -> None:
    keys = zipf_keys(20_000, 1_000, seed=5)
    run = await new_run(keys)
    run.observe()
    await asyncio.gather(
        *(run.add(f"member-{index}", work_s=0.0002, concurrency=concurrency) for index in range(4))
    )

    await run.until_processed(len(keys), timeout_s=120)
    await run.until_stable_offset(len(keys))

    print(
        f"\npeak stored state of the partition: {run.observer.peak_ic_ranges} IC ranges, "
        f"{run.observer.peak_watermarks} watermark pieces ({run.observer.polls} polls)"
    )
    assert run.ledger.missing() == []
    assert run.ledger.order_violations() == []
    assert run.observer.overlaps == []
    assert run.ledger.unexplained_duplicates(run.lost_at()) == {}
    run.check_members_kept_to_their_slices()
    workers = {entry.member for entry in run.ledger.handled}
    assert workers == {f"member-{index}" for index in range(4)}, "the partition was not shared"
    assert run.observer.polls >= 10
    # Watermarks cover what each member processed in order: one piece per slice (a few more
    # while slices move), whatever the key interleaving.
    assert run.observer.peak_watermarks <= 16
    if concurrency == 0:
        # IC ranges alone would store one range per record of every member but the slowest.
        assert run.observer.peak_ic_ranges <= 4
    else:
        # Keys run concurrently, so records complete out of order behind a hot key's
        # backlog and need IC ranges; they must stay well clear of the limit.
        assert run.observer.peak_ic_ranges < MAX_IC_RANGES_PER_PARTITION


class ProcessMember(WorkerProcess):
    """A member in its own process, to be killed with SIGKILL."""

    def __init__(self, run: Run, out: Path) -> None:
        super().__init__(
            bootstrap=run.bootstrap,
            coordinator=run.coordinator,
            group=run.group,
            topic=run.topic,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            options=["--out", str(out), "--work-ms", "0.5"],
        )
        self.out = out

    def processed(self) -> list[int]:
        if not self.out.exists():
            return []
        lines = self.out.read_bytes().split(b"\n")
        return [int(line) for line in lines if line]


@pytest.mark.parametrize("death", ["task-cancelled", "process-killed"])
async def test_a_dead_member_s_uncommitted_records_go_to_its_heir_and_nothing_is_lost(
    new_run: Callable[..., Awaitable[Run]], tmp_path: Path, death: str
) -> None:
    keys = zipf_keys(8_000, 1_000, seed=6)
    run = await new_run(keys)
    run.observe()
    victim_process: ProcessMember | None = None
    victim_member: Member | None = None
    if death == "process-killed":
        victim_process = ProcessMember(run, tmp_path / "processed.txt")
        await victim_process.start()
        await asyncio.gather(*(run.add(f"member-{index}") for index in range(3)))
    else:
        await asyncio.gather(*(run.add(f"member-{index}") for index in range(4)))
        victim_member = run.members[0]

    def victim_offsets() -> list[int]:
        if victim_process is not None:
            return victim_process.processed()
        return [entry.offset for entry in run.ledger.handled if entry.member == "member-0"]

    tp = TopicPartition(run.topic, 0)

    async def committed_state() -> CommittedOffsets:
        async with CoordinatorClient(run.coordinator) as api:
            # A partition the group has not committed yet is absent: nothing is committed.
            stored = await api.fetch_offsets(run.group, [run.topic])
            return stored.get(tp, CommittedOffsets.empty(0))

    def committed_among(offsets: set[int], committed: CommittedOffsets) -> set[int]:
        return {o for o in offsets if committed.is_processed(o, key_hash(keys[o], o))}

    try:
        # Kill it mid-stream once part of its work is committed and part is not.
        await until(lambda: len(victim_offsets()) >= 300, 60, "the victim to process 300 records")
        for _ in range(100):
            if len(committed_among(set(victim_offsets()), await committed_state())) >= 100:
                break
            await asyncio.sleep(0.05)
        if victim_process is not None:
            await victim_process.kill()
        else:
            assert victim_member is not None
            await victim_member.crash()
        died_with = set(victim_offsets())
        # A commit already on the wire when it died may still land; then the state is final
        # until its session expires.
        await asyncio.sleep(0.3)
        uncommitted = died_with - committed_among(died_with, await committed_state())

        # What it committed before dying is not processed again.
        await until(
            lambda: len(run.ledger.processed() | died_with) >= len(keys),
            90,
            "every record processed by the victim or the survivors",
        )
        await run.until_stable_offset(len(keys))
    finally:
        if victim_process is not None and victim_process.process is not None:
            with contextlib.suppress(ProcessLookupError):
                victim_process.process.kill()

    victim_name = "member-0" if victim_member is not None else "process-member"
    survivors: dict[int, list[str]] = {}
    for entry in run.ledger.handled:
        if entry.member != victim_name:
            survivors.setdefault(entry.offset, []).append(entry.member)
    redelivered = {offset for offset in died_with if offset in survivors}
    print(
        f"\n{death}: the victim processed {len(died_with)} records, {len(uncommitted)} of them "
        f"uncommitted; {len(redelivered)} redelivered"
    )
    assert [o for o in range(len(keys)) if o not in survivors and o not in died_with] == []
    assert redelivered == uncommitted
    lost_at = run.lost_at()
    lost_at.pop(victim_name, None)
    survivors_only = Ledger(keys, [e for e in run.ledger.handled if e.member != victim_name])
    assert survivors_only.unexplained_duplicates(lost_at) == {}
    assert run.ledger.order_violations() == []
    assert run.observer.overlaps == []
    run.check_members_kept_to_their_slices()


async def test_members_joining_and_leaving_never_process_one_key_at_once(
    new_run: Callable[..., Awaitable[Run]],
) -> None:
    keys = zipf_keys(12_000, 1_000, seed=7)
    run = await new_run(keys)
    run.observe()
    first, second = await asyncio.gather(run.add("member-0"), run.add("member-1"))
    steps: list[tuple[float, str, str]] = [
        (0.15, "join", "member-2"),
        (0.25, "join", "member-3"),
        (0.40, "leave", "member-0"),
        (0.55, "join", "member-4"),
        (0.70, "leave", "member-2"),
        (0.80, "leave", "member-1"),
    ]
    by_name = {member.name: member for member in (first, second)}
    for fraction, action, name in steps:
        await run.until_processed(int(len(keys) * fraction))
        if action == "join":
            by_name[name] = await run.add(name)
        else:
            await by_name[name].leave()

    await run.until_processed(len(keys), timeout_s=120)
    await run.until_stable_offset(len(keys))

    losses = sum(len(times) for times in run.lost_at().values())
    print(
        f"\njoin/leave: {len(run.ledger.duplicates())} records processed twice, "
        f"{losses} membership losses"
    )
    assert run.ledger.missing() == []
    assert run.ledger.order_violations() == []
    assert run.observer.overlaps == []
    # Clean hand-offs commit before releasing: a record is processed again only after the
    # member that processed it lost its slices without committing.
    assert run.ledger.unexplained_duplicates(run.lost_at()) == {}
    run.check_members_kept_to_their_slices()


async def test_a_topic_without_range_fetch_is_never_split(
    new_run: Callable[..., Awaitable[Run]],
) -> None:
    keys = zipf_keys(2_000, 100, seed=8)
    run = await new_run(keys, range_fetch=False)
    run.observe()
    await asyncio.gather(*(run.add(f"member-{index}") for index in range(3)))

    await run.until_processed(len(keys))
    await run.until_stable_offset(len(keys))
    settled_at = run.observer.polls
    await until(lambda: run.observer.polls >= settled_at + 3, 30, "polls of the settled group")

    assert run.ledger.missing() == []
    assert run.observer.overlaps == []
    assert run.observer.partial_holdings == []
    assert run.observer.max_holders == 1
    for member in run.members:
        assignment = member.consumer.assignment()
        assert all(len(ranges) == 1 and ranges[0].size == 2**63 for ranges in assignment.values())
    # The whole partition may move between members, but is never worked on by two at once.
    assert run.ledger.order_violations() == []
    assert run.ledger.unexplained_duplicates(run.lost_at()) == {}
