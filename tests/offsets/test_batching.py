"""Group commit: requests sharing one transaction are judged and applied as if alone."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from prometheus_client.registry import Collector
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from coordinator import metrics
from coordinator.db.engine import make_engine
from coordinator.errors import FencedMemberEpoch, KeyrangeError, UnknownMemberId
from coordinator.offsets import literals, repository
from coordinator.offsets.batching import CommitBatcher
from coordinator.offsets.schemas import CommitRequest
from coordinator.offsets.service import CommitResult
from tests.fixtures.coordinator import insert_live_member, settings_for_tests
from tests.waiting import until


@pytest_asyncio.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(database_url, settings_for_tests())
    yield engine
    await engine.dispose()


def commit_request(
    *partitions: dict[str, object], member: tuple[str, int] | None = None
) -> CommitRequest:
    body: dict[str, object] = {"partitions": list(partitions)}
    if member is not None:
        body["member_id"], body["member_epoch"] = member
    return CommitRequest.model_validate(body)


def reruns() -> float:
    """Requests re-run as batches of one so far (the metric the batcher keeps)."""
    return _sample(metrics.COMMITS_RERUN_ALONE, "_total")


async def with_live_member(
    engine: AsyncEngine, database_url: str, group_id: str, epoch: int
) -> None:
    async with engine.begin() as connection:
        await connection.execute(text("INSERT INTO groups (group_id) VALUES (:g)"), {"g": group_id})
    await insert_live_member(database_url, group_id, "m1", epoch=epoch, previous_epoch=epoch - 1)


async def stored(
    engine: AsyncEngine, group_id: str
) -> list[tuple[str, int, int, tuple[tuple[int, int], ...]]]:
    async with engine.connect() as connection:
        rows = await repository.read_partitions(connection, group_id)
    return [(r.topic, r.partition, r.state.stable_offset, r.state.ranges) for r in rows]


async def test_one_transaction_judges_each_request_alone(
    engine: AsyncEngine, database_url: str
) -> None:
    await with_live_member(engine, database_url, "batch-members", epoch=5)
    batcher = CommitBatcher(engine, settings_for_tests())
    requests = [
        ("batch-new", commit_request({"topic": "t", "partition": 0, "offset": 7})),
        ("batch-shared", commit_request({"topic": "t", "partition": 0, "ranges": [[0, 4]]})),
        ("batch-shared", commit_request({"topic": "t", "partition": 0, "ranges": [[5, 9]]})),
        ("batch-shared", commit_request({"topic": "t", "partition": 0, "ranges": [[3, 6]]})),
        (
            "batch-members",
            commit_request({"topic": "t", "partition": 1, "offset": 3}, member=("m1", 3)),
        ),
        (
            "batch-members",
            commit_request({"topic": "t", "partition": 2, "offset": 4}, member=("gone", 1)),
        ),
        ("batch-members", commit_request({"topic": "t", "partition": 3, "offset": 5})),
        (
            "batch-members",
            commit_request({"topic": "t", "partition": 4, "ranges": [[0, 1]]}, member=("m1", 4)),
        ),
    ]
    # Queued before any worker runs, so one worker drains them all into one transaction.
    batches_before, reruns_before = _batches(), reruns()
    replies = [asyncio.ensure_future(batcher.submit(g, r)) for g, r in requests]
    await asyncio.sleep(0)
    batcher.start()
    outcomes = await asyncio.gather(*replies, return_exceptions=True)
    await batcher.close()

    assert _batches() - batches_before == 1
    assert reruns() == reruns_before  # every request was decided inside the batch
    new, first, second, overlapping, stale, unknown, standalone, member = outcomes
    assert isinstance(new, CommitResult)
    assert new.reply.partitions[0].last_stable_offset == 7
    # Same partition, arrival order: each reply shows the state its request left.
    assert isinstance(first, CommitResult) and isinstance(second, CommitResult)
    assert first.reply.partitions[0].last_stable_offset == 5
    assert second.reply.partitions[0].last_stable_offset == 10
    assert isinstance(overlapping, CommitResult)
    assert overlapping.reply.partitions[0].error == "INDIVIDUAL_COMMIT_TOO_OLD"
    assert isinstance(stale, FencedMemberEpoch)
    assert isinstance(unknown, UnknownMemberId)
    assert isinstance(standalone, UnknownMemberId)  # the group has a live member
    assert isinstance(member, CommitResult)
    assert member.reply.partitions[0].error is None

    assert await stored(engine, "batch-new") == [("t", 0, 7, ())]
    assert await stored(engine, "batch-shared") == [("t", 0, 10, ())]
    # Refused requests created nothing; the admitted member commit is stored.
    assert await stored(engine, "batch-members") == [("t", 4, 2, ())]


async def test_a_new_group_beside_locked_rows_is_created_by_its_request_alone(
    engine: AsyncEngine,
) -> None:
    """A group is created under its tenant's cap lock, which no transaction may wait for
    while it holds partition rows: a batch that locked some leaves a new group's commit to a
    transaction of its own, which creates the group and applies the commit."""
    first = CommitBatcher(engine, settings_for_tests())
    first.start()
    await first.submit("batch-stored", commit_request({"topic": "t", "partition": 0, "offset": 1}))
    await first.close()
    batcher = CommitBatcher(engine, settings_for_tests(commit_batch_workers=1))
    batches_before, reruns_before = _batches(), reruns()
    # Queued before the one worker runs, so it takes both into one batch.
    replies = [
        asyncio.ensure_future(batcher.submit(group, commit_request(entry)))
        for group, entry in [
            ("batch-stored", {"topic": "t", "partition": 0, "offset": 2}),
            ("batch-created-alone", {"topic": "t", "partition": 0, "offset": 3}),
        ]
    ]
    await asyncio.sleep(0)
    batcher.start()
    stored_commit, new_commit = await asyncio.gather(*replies)
    await batcher.close()
    assert _batches() - batches_before == 1
    assert reruns() == reruns_before + 1
    assert stored_commit.reply.partitions[0].last_stable_offset == 2
    assert new_commit.reply.partitions[0].last_stable_offset == 3
    assert await stored(engine, "batch-created-alone") == [("t", 0, 3, ())]


async def test_switch_off_refuses_individual_commits_first(
    engine: AsyncEngine, database_url: str
) -> None:
    await with_live_member(engine, database_url, "batch-switch", epoch=2)
    batcher = CommitBatcher(engine, settings_for_tests())
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO coordinator_config (id, accept_individual_commit, "
                "default_accept_range_fetch) VALUES (1, false, false) ON CONFLICT (id) "
                "DO UPDATE SET accept_individual_commit = false"
            )
        )
    batcher.start()
    try:
        # Stale epoch and ranges: the switch is the error, as on the single-request path.
        with pytest.raises(KeyrangeError) as refused:
            await batcher.submit(
                "batch-switch",
                commit_request(
                    {"topic": "t", "partition": 0, "ranges": [[0, 0]]}, member=("m1", 9)
                ),
            )
        assert refused.value.error == "INDIVIDUAL_COMMIT_NOT_ALLOWED"
        classic = await batcher.submit(
            "batch-switch",
            commit_request({"topic": "t", "partition": 0, "offset": 1}, member=("m1", 2)),
        )
        assert classic.reply.partitions[0].last_stable_offset == 1
    finally:
        async with engine.begin() as connection:
            await connection.execute(
                text("UPDATE coordinator_config SET accept_individual_commit = true WHERE id = 1")
            )
        await batcher.close()


async def test_failed_transaction_applies_each_request_alone(database_url: str) -> None:
    """A batch that the database aborts (here: a lock wait past the statement timeout) loses
    nothing: its requests are re-run, each as a batch of one."""
    main = make_engine(database_url, settings_for_tests())
    # Long enough that the holder, polling, releases the rows before the re-run's own wait
    # times out too, even on a busy machine.
    impatient = make_engine(database_url, settings_for_tests(db_statement_timeout_ms=1000))
    batcher = CommitBatcher(impatient, settings_for_tests())
    batcher.start()
    try:
        reruns_before = reruns()
        first = await batcher.submit(
            "batch-retry", commit_request({"topic": "t", "partition": 0, "offset": 1})
        )
        assert first.reply.partitions[0].last_stable_offset == 1
        assert reruns() == reruns_before
        # The rows are released once the batch's lock wait timed out and it went alone.
        pending = await commit_past_a_row_lock(
            main, batcher, "batch-retry", 9, released_when=lambda: reruns() > reruns_before
        )
        result = await pending
        assert reruns() == reruns_before + 1
        assert result.reply.partitions[0].last_stable_offset == 9
        assert await stored(main, "batch-retry") == [("t", 0, 9, ())]
    finally:
        await batcher.close()
        await main.dispose()
        await impatient.dispose()


async def commit_past_a_row_lock(
    holder_engine: AsyncEngine,
    batcher: CommitBatcher,
    group_id: str,
    offset: int,
    *,
    released_when: Callable[[], object],
) -> asyncio.Future[CommitResult]:
    """Submit a commit while another transaction holds the group's offset rows, and keep them
    held until ``released_when()`` (the batch gave up waiting); the commit's future."""
    async with holder_engine.connect() as holder:
        transaction = await holder.begin()
        await holder.execute(
            text("SELECT 1 FROM partition_offsets WHERE group_id = :g FOR UPDATE"), {"g": group_id}
        )
        pending = asyncio.ensure_future(
            batcher.submit(
                group_id, commit_request({"topic": "t", "partition": 0, "offset": offset})
            )
        )
        await until(released_when, 30, "the batch to give up waiting for the held rows")
        await transaction.rollback()
    return pending


async def test_a_batch_holds_no_more_partitions_than_one_request_may(
    engine: AsyncEngine,
) -> None:
    settings = settings_for_tests(max_partitions_per_request=3)
    batcher = CommitBatcher(engine, settings)
    requests = [
        commit_request(*({"topic": "t", "partition": p, "offset": 1} for p in (0, 1))),
        commit_request({"topic": "t", "partition": 2, "offset": 1}),
        commit_request({"topic": "t", "partition": 3, "offset": 1}),
    ]
    batches_before = _batches()
    replies = [asyncio.ensure_future(batcher.submit("batch-bounded", r)) for r in requests]
    await asyncio.sleep(0)
    batcher.start()
    results = await asyncio.gather(*replies)
    await batcher.close()
    assert [len(r.reply.partitions) for r in results] == [2, 1, 1]
    # 2 + 1 partitions fit in one transaction; the third request went into the next.
    assert _batches() - batches_before == 2
    assert await stored(engine, "batch-bounded") == [("t", p, 1, ()) for p in range(4)]


async def test_requests_arriving_together_are_shared_by_the_waiting_workers(
    engine: AsyncEngine,
) -> None:
    """Eight requests for four idle workers make four transactions of two, which overlap,
    rather than one transaction of eight while three workers wait."""
    settings = settings_for_tests(commit_batch_workers=4)
    batcher = CommitBatcher(engine, settings)
    batcher.start()
    await until(lambda: batcher.idle_workers == 4, 30, "every worker to wait for work")
    batches_before = _batches()
    requests = [commit_request({"topic": "t", "partition": p, "offset": 1}) for p in range(8)]
    results = await asyncio.gather(*(batcher.submit("batch-spread", r) for r in requests))
    await batcher.close()
    assert all(r.reply.partitions[0].error is None for r in results)
    assert _batches() - batches_before == 4
    assert await stored(engine, "batch-spread") == [("t", p, 1, ()) for p in range(8)]


async def test_workers_give_their_connections_back_once_the_queue_is_empty(
    engine: AsyncEngine,
) -> None:
    batcher = CommitBatcher(engine, settings_for_tests())
    batcher.start()
    try:
        await asyncio.gather(
            *(
                batcher.submit(
                    "batch-idle", commit_request({"topic": "t", "partition": p, "offset": 1})
                )
                for p in range(16)
            )
        )
        # A worker releases its connection right after answering its last batch.
        await until(lambda: checked_out(engine) == 0, 30, "every connection to be returned")
    finally:
        await batcher.close()


async def test_without_a_database_each_request_gets_the_error_and_the_workers_live_on() -> None:
    unreachable = make_engine(
        f"postgresql+asyncpg://keyrange@127.0.0.1:{_closed_port()}/none", settings_for_tests()
    )
    batcher = CommitBatcher(unreachable, settings_for_tests())
    batcher.start()
    try:
        for _ in range(2):
            with pytest.raises(OSError):
                await batcher.submit(
                    "batch-down", commit_request({"topic": "t", "partition": 0, "offset": 1})
                )
        assert not any(worker.done() for worker in batcher._workers)
    finally:
        await batcher.close()
        await unreachable.dispose()


async def test_requests_re_run_alone_get_the_workers_connection(database_url: str) -> None:
    """With a pool of one, a failed batch's requests can only be re-run once the worker has
    given its connection back."""
    settings = settings_for_tests(db_pool_size=1, db_statement_timeout_ms=1000)
    single = make_engine(database_url, settings)
    holder_engine = make_engine(database_url, settings_for_tests())
    batcher = CommitBatcher(single, settings)
    batcher.start()
    try:
        await batcher.submit(
            "batch-one", commit_request({"topic": "t", "partition": 0, "offset": 1})
        )
        reruns_before = reruns()
        pending = await commit_past_a_row_lock(
            holder_engine, batcher, "batch-one", 7, released_when=lambda: reruns() > reruns_before
        )
        # Far below the pool's 30 s checkout timeout, which a worker holding two would hit.
        result = await asyncio.wait_for(pending, timeout=10)
        assert result.reply.partitions[0].last_stable_offset == 7
    finally:
        await batcher.close()
        await single.dispose()
        await holder_engine.dispose()


async def test_busy_workers_give_way_to_other_users_of_an_exhausted_pool(
    database_url: str,
) -> None:
    # Small batches from many committers: the queue is never empty when the worker looks.
    settings = settings_for_tests(
        db_pool_size=1, commit_batch_workers=1, commit_batch_max_requests=4
    )
    single = make_engine(database_url, settings)
    batcher = CommitBatcher(single, settings)
    batcher.start()
    committed = 0
    busy = asyncio.Event()

    async def keep_committing(partition: int) -> None:
        nonlocal committed
        offset = 0
        while True:
            offset += 1
            await batcher.submit(
                "batch-busy",
                commit_request({"topic": "t", "partition": partition, "offset": offset}),
            )
            committed += 1
            if committed == 50:  # the workers are in a busy period
                busy.set()

    committers = [asyncio.create_task(keep_committing(p)) for p in range(32)]
    try:
        await asyncio.wait_for(busy.wait(), timeout=30)
        async with asyncio.timeout(10):  # the pool's own checkout timeout is 30 s
            async with single.connect() as connection:
                assert (await connection.execute(text("SELECT 1"))).scalar() == 1
    finally:
        for task in committers:
            task.cancel()
        await asyncio.gather(*committers, return_exceptions=True)
        await batcher.close()
        await single.dispose()


def checked_out(engine: AsyncEngine) -> int:
    pool = engine.sync_engine.pool
    assert isinstance(pool, QueuePool)
    return pool.checkedout()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _batches() -> float:
    return _sample(metrics.COMMIT_BATCH_SIZE, "_count")


def _sample(collector: Collector, suffix: str) -> float:
    return next(
        sample.value
        for metric in collector.collect()
        for sample in metric.samples
        if sample.name.endswith(suffix)
    )


async def test_a_row_written_by_someone_else_is_read_as_stored(engine: AsyncEngine) -> None:
    """The batcher keeps the states it wrote, to skip decoding rows read back unchanged; a
    row changed since (here as an admin reset or another coordinator would) is read anew."""
    batcher = CommitBatcher(engine, settings_for_tests())
    batcher.start()
    try:
        ranges = {"topic": "t", "partition": 0, "ranges": [[5, 6], [9, 9]]}
        first = await batcher.submit("batch-written", commit_request(ranges))
        assert first.reply.partitions[0].last_stable_offset == 0
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "UPDATE partition_offsets SET ic_ranges = '{[7,9)}' "
                    "WHERE group_id = 'batch-written'"
                )
            )
        filled = await batcher.submit(
            "batch-written", commit_request({"topic": "t", "partition": 0, "ranges": [[0, 6]]})
        )
        # The stored [7, 8] fills the gap: 9. The batcher's own write ([5, 6], [9, 9]) would give 7.
        assert filled.reply.partitions[0].last_stable_offset == 9
        assert await stored(engine, "batch-written") == [("t", 0, 9, ())]
        again = await batcher.submit(
            "batch-written", commit_request({"topic": "t", "partition": 0, "ranges": [[11, 12]]})
        )
        assert again.reply.partitions[0].last_stable_offset == 9
        assert await stored(engine, "batch-written") == [("t", 0, 9, ((11, 12),))]
    finally:
        await batcher.close()


async def test_a_row_read_back_as_written_is_not_decoded_again(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Postgres' text of a row the batcher wrote is the text it remembered for it (ranges,
    watermark pieces and metadata included), so the next commit takes the state it kept."""
    decoded: list[str] = []
    decode = literals.state_of_text

    def counting(text: str, metadata: str | None) -> repository.CommittedOffsets:
        decoded.append(text)
        return decode(text, metadata)

    monkeypatch.setattr(literals, "state_of_text", counting)
    batcher = CommitBatcher(engine, settings_for_tests())
    batcher.start()
    try:
        entry = {
            "topic": "t",
            "partition": 0,
            "ranges": [[5, 6], [9, 9], [2**62, 2**62 + 3]],
            "watermarks": [[0, 2**62 - 1, 12], [2**62, 2**63 - 1, 4]],
            "metadata": 'a "quoted" \\ note, {braces} | bars',
        }
        first = await batcher.submit("batch-read-back", commit_request(entry))
        # Both watermarks cover the whole key space: the stable offset moves to the lower, 4.
        assert first.reply.partitions[0].last_stable_offset == 4
        assert decoded == []  # a new row is read where it is created, from its columns
        second = await batcher.submit(
            "batch-read-back",
            commit_request({"topic": "t", "partition": 0, "ranges": [[20, 21]]}),
        )
        assert decoded == []
        assert second.reply.partitions[0].last_stable_offset == 4
        assert await stored(engine, "batch-read-back") == [
            ("t", 0, 4, ((5, 6), (9, 9), (20, 21), (2**62, 2**62 + 3)))
        ]
    finally:
        await batcher.close()
