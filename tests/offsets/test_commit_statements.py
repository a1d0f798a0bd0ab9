"""The statements a batch of commits runs, counted on the real database: a batch costs a fixed
number of statements whatever it carries (docs/offsets.md, "Statements per batch"), so a change
that adds a statement per request, or per partition, fails here before any benchmark sees it."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.db import quotas
from coordinator.db.engine import make_engine
from coordinator.errors import KeyrangeError
from coordinator.offsets import literals, repository
from coordinator.offsets.batching import CommitBatcher
from coordinator.offsets.schemas import CommitRequest
from coordinator.offsets.service import CommitResult
from tests.fixtures.coordinator import insert_live_member, settings_for_tests

_NAMES = {
    "BEGIN;": "begin",
    "COMMIT;": "commit",
    "ROLLBACK;": "rollback",
    repository._LOCK_BATCH: "lock batch",
    repository._LOCK_PARTITIONS: "lock partitions",
    repository._PREPARE_WRITE: "prepare write",
    repository._CREATE_PARTITIONS: "insert partitions",
    quotas._LOCK: "cap lock",
    quotas._GROUPS_PER_SCOPE: "count groups",
    quotas._CREATE_GROUPS: "insert groups",
    quotas._PARTITIONS_PER_GROUP: "count partitions",
}
# The write travels with its COMMIT, its arrays spliced in: named by how it starts and ends.
_WRITE_AND_COMMIT = repository._WRITE_AND_COMMIT.split("{", 1)[0]


# asyncpg looks up a type it has not met on a connection once per connection (with JIT off
# around it): a connection's cost, not a batch's.
_INTROSPECTION = ("typeinfo_tree", "set_config('jit'")


class Statements:
    """Every statement the engine's connections run, by name, while ``recording``."""

    def __init__(self) -> None:
        self.recording = False
        self.names: list[str] = []

    def log(self, query: Any) -> None:
        if self.recording and not any(mark in query.query for mark in _INTROSPECTION):
            name = _NAMES.get(query.query, query.query)
            if name.startswith(_WRITE_AND_COMMIT) and name.endswith("COMMIT;"):
                name = "write and commit"
            elif name.startswith(_WRITE_AND_COMMIT) and name.endswith("COMMIT;\nBEGIN;"):
                name = "write, commit and begin"
            self.names.append(name)

    def take(self) -> Counter[str]:
        taken = Counter(self.names)
        self.names = []
        return taken


@pytest_asyncio.fixture
async def engine(database_url: str) -> AsyncIterator[tuple[AsyncEngine, Statements]]:
    engine = make_engine(database_url, settings_for_tests())
    statements = Statements()

    @event.listens_for(engine.sync_engine, "connect")
    def _log_queries(dbapi_connection: Any, _: object) -> None:
        driver: asyncpg.Connection = dbapi_connection.driver_connection
        driver.add_query_logger(statements.log)

    yield engine, statements
    await engine.dispose()


def _request(
    partitions: range, watermark: int, member: tuple[str, int] | None = None
) -> CommitRequest:
    body: dict[str, object] = {
        "partitions": [
            {
                "topic": "t",
                "partition": partition,
                "watermarks": [[0, 2**62, watermark]],
                "ranges": [[watermark + 2, watermark + 3]],
                "metadata": 'quoted "text", {braces} and a \\ backslash',
            }
            for partition in partitions
        ]
    }
    if member is not None:
        body["member_id"], body["member_epoch"] = member
    return CommitRequest.model_validate(body)


async def _one_batch(
    engine: AsyncEngine, statements: Statements, commits: list[tuple[str, CommitRequest]]
) -> tuple[list[CommitResult | BaseException], Counter[str]]:
    """``commits`` queued before the one worker runs, so it applies them in one transaction."""
    batcher = CommitBatcher(engine, settings_for_tests(commit_batch_workers=1))
    statements.recording = True
    replies = [asyncio.ensure_future(batcher.submit(group, request)) for group, request in commits]
    await asyncio.sleep(0)
    batcher.start()
    outcomes = await asyncio.gather(*replies, return_exceptions=True)
    await batcher.close()
    statements.recording = False
    return outcomes, statements.take()


STEADY = Counter({"begin": 1, "lock batch": 1, "write and commit": 1})


@pytest.mark.parametrize("requests", [1, 16])
async def test_standalone_commits_to_stored_partitions_cost_three_statements(
    engine: tuple[AsyncEngine, Statements], requests: int
) -> None:
    engine_, statements = engine
    group = f"statements-standalone-{requests}"
    await _one_batch(engine_, statements, [(group, _request(range(64), 10))])
    outcomes, counted = await _one_batch(
        engine_,
        statements,
        [(group, _request(range(4 * i, 4 * i + 4), 20 + i)) for i in range(requests)],
    )
    assert all(isinstance(outcome, CommitResult) for outcome in outcomes)
    assert counted == STEADY


@pytest.mark.parametrize("requests", [1, 16])
async def test_member_commits_and_both_kinds_cost_three_statements(
    engine: tuple[AsyncEngine, Statements], database_url: str, requests: int
) -> None:
    engine_, statements = engine
    group = f"statements-members-{requests}"
    async with engine_.begin() as connection:
        await connection.execute(text("INSERT INTO groups (group_id) VALUES (:g)"), {"g": group})
    for i in range(requests):
        await insert_live_member(database_url, group, f"m{i}", epoch=3, previous_epoch=2)
    await _one_batch(engine_, statements, [(group, _request(range(64), 10, ("m0", 3)))])
    members = [
        (group, _request(range(4 * i, 4 * i + 4), 20, (f"m{i}", 3))) for i in range(requests)
    ]

    outcomes, counted = await _one_batch(engine_, statements, members)
    assert all(isinstance(outcome, CommitResult) for outcome in outcomes)
    assert counted == STEADY

    standalone = f"statements-both-{requests}"
    await _one_batch(engine_, statements, [(standalone, _request(range(64), 10))])
    both = [
        (group, _request(range(4 * i, 4 * i + 4), 30, (f"m{i}", 3))) for i in range(requests)
    ] + [(standalone, _request(range(4 * i, 4 * i + 4), 20)) for i in range(requests)]
    outcomes, counted = await _one_batch(engine_, statements, both)
    assert all(isinstance(outcome, CommitResult) for outcome in outcomes)
    assert counted == STEADY


@pytest.mark.parametrize("groups", [1, 8])
async def test_first_commits_add_the_caps_statements_once_per_batch(
    engine: tuple[AsyncEngine, Statements], groups: int
) -> None:
    engine_, statements = engine
    commits = [(f"statements-new-{groups}-{g}", _request(range(8), 10)) for g in range(groups)]
    outcomes, counted = await _one_batch(engine_, statements, commits)
    assert all(isinstance(outcome, CommitResult) for outcome in outcomes)
    assert counted == STEADY + Counter(
        {
            # Once per connection, and this batch is its connection's first write.
            "prepare write": 1,
            # Group cap: lock the tenant's count, count, create.
            "cap lock": 2,
            "count groups": 1,
            "insert groups": 1,
            # Partition cap: lock the group's count, count, re-read rows added meanwhile,
            # insert, lock the new rows.
            "count partitions": 1,
            "insert partitions": 1,
            "lock partitions": 2,
        }
    )


async def test_a_batch_of_refused_commits_writes_no_partition(
    engine: tuple[AsyncEngine, Statements],
) -> None:
    engine_, statements = engine
    commits = [("statements-nobody", _request(range(4), 10, (f"gone{i}", 1))) for i in range(4)]
    outcomes, counted = await _one_batch(engine_, statements, commits)
    assert all(isinstance(outcome, KeyrangeError) for outcome in outcomes)
    assert counted == Counter({"begin": 1, "lock batch": 1, "commit": 1})


async def test_text_parameters_and_ranges_keep_every_character_and_range(
    engine: tuple[AsyncEngine, Statements], database_url: str
) -> None:
    engine_, statements = engine
    odd = "NULL\", {x}, \\ \\\" 'quoted' \u00e9\u6f22 "
    group = 'group.with-"odd"_name'
    request = CommitRequest.model_validate(
        {
            "partitions": [
                {"topic": "t", "partition": 0, "ranges": [[5, 5], [7, 9]], "metadata": odd}
            ]
        }
    )
    await _one_batch(engine_, statements, [(group, request)])
    async with engine_.connect() as connection:
        (stored,) = await repository.read_partitions(connection, group)
    assert stored.state.metadata == odd
    assert stored.state.ranges == ((5, 5), (7, 9))

    await insert_live_member(database_url, group, odd, epoch=3, previous_epoch=2)
    member_commit = _request(range(1), 20, (odd, 3))
    (outcome,), _ = await _one_batch(engine_, statements, [(group, member_commit)])
    assert isinstance(outcome, CommitResult)
    assert outcome.reply.partitions[0].error is None


def test_ranges_read_as_text_are_the_ranges_stored() -> None:
    assert literals.ranges_from_text("{}") == ()
    assert literals.ranges_from_text("{[5,6),[7,10)}") == ((5, 5), (7, 9))
    # Unbounded ranges are no commit's; skipped as the binary reading skips them.
    assert literals.ranges_from_text("{(,3),[7,10),[12,)}") == ((7, 9),)


async def test_a_write_prepared_unbeknown_to_the_batcher_costs_one_batch(
    engine: tuple[AsyncEngine, Statements],
) -> None:
    """A batch cancelled after its ``PREPARE`` ran but before it heard back leaves the write
    prepared on a connection the batcher does not know about: one batch fails and is re-run,
    and the connection's later batches use the prepared write."""
    engine_, statements = engine
    group = "statements-prepared-elsewhere"
    async with engine_.connect() as connection:
        raw = await connection.get_raw_connection()
        assert raw.driver_connection is not None
        await raw.driver_connection.execute(repository._PREPARE_WRITE)
        await connection.commit()
    (outcome,), _ = await _one_batch(engine_, statements, [(group, _request(range(4), 10))])
    assert isinstance(outcome, CommitResult)
    outcomes, counted = await _one_batch(engine_, statements, [(group, _request(range(4), 20))])
    assert all(isinstance(o, CommitResult) for o in outcomes)
    assert counted == STEADY


async def _queued_one_by_one(
    engine: AsyncEngine,
    statements: Statements,
    commits: list[tuple[str, CommitRequest]],
    **settings: object,
) -> Counter[str]:
    """``commits`` queued before the one worker runs, applied one per batch."""
    batcher = CommitBatcher(
        engine,
        settings_for_tests(commit_batch_workers=1, commit_batch_max_requests=1, **settings),
    )
    statements.recording = True
    replies = [asyncio.ensure_future(batcher.submit(group, request)) for group, request in commits]
    await asyncio.sleep(0)
    batcher.start()
    assert all(isinstance(reply, CommitResult) for reply in await asyncio.gather(*replies))
    await batcher.close()
    statements.recording = False
    return statements.take()


async def test_batches_back_to_back_on_one_connection_share_their_begins(
    engine: tuple[AsyncEngine, Statements],
) -> None:
    """A batch that leaves work queued opens the next one's transaction with its COMMIT; the
    last one leaves the connection idle."""
    engine_, statements = engine
    group = "statements-back-to-back"
    await _one_batch(engine_, statements, [(group, _request(range(4), 10))])
    counted = await _queued_one_by_one(
        engine_, statements, [(group, _request(range(4), 20 + i)) for i in range(4)]
    )
    assert counted == Counter(
        {"begin": 1, "lock batch": 4, "write, commit and begin": 3, "write and commit": 1}
    )
    async with engine_.connect() as connection:
        raw = await connection.get_raw_connection()
        assert not raw.driver_connection.is_in_transaction()


async def test_a_transaction_opened_for_a_batch_that_does_not_follow_is_rolled_back(
    engine: tuple[AsyncEngine, Statements],
) -> None:
    """With no connection left in the pool (a pool of one, as this batcher is told), a worker
    gives its connection back after each batch, so the transaction it opened for the next is
    rolled back, and the next batch begins its own."""
    engine_, statements = engine
    group = "statements-pool-exhausted"
    await _one_batch(engine_, statements, [(group, _request(range(4), 10))])
    counted = await _queued_one_by_one(
        engine_,
        statements,
        [(group, _request(range(4), 20 + i)) for i in range(2)],
        db_pool_size=1,
        db_max_overflow=0,
    )
    assert counted == Counter(
        {
            "begin": 2,
            "lock batch": 2,
            "write, commit and begin": 1,
            "rollback": 1,
            "write and commit": 1,
        }
    )
