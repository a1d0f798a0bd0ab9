"""Group commit: the one way a commit is applied. Concurrent commit requests share one
database transaction.

At the rates Keyrange clients commit, the database and the coordinator spend their time on
per-transaction and per-statement work (round trips, WAL flushes, driver calls), not on the
offsets. Requests that arrive while a transaction is in flight are queued and the next
transaction applies all of them with the statements ``coordinator.offsets.repository``
counts (three in the common case: ``BEGIN``, one locking read, the write sent with its
``COMMIT``) whatever their number, so the cost of a commit falls as load rises, while a lone
commit waits for nobody.

Each request stays all-or-nothing and is judged exactly as on its own (docs/design.md §3.7) by the
fence in ``coordinator.core.fence``: the switch, then its membership, under the locks that keep
them true, then the caps of ``coordinator.core.quotas`` on the groups and partition rows it
would create; a refused request changes nothing (it creates no group and no row) and the others
in its transaction are applied. Two requests of one transaction that touch the same partition
are applied one after the other in arrival order. A reply is sent only once the transaction has
committed. A request the batch cannot decide (its group was created by another transaction in
the middle of the batch, or is new while the batch holds partition rows already), and every
request of a batch whose transaction failed, is re-run as a batch of one in a transaction of
its own; commits are idempotent, so a batch whose commit outcome is unknown is safe to
re-apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import cast

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from client.protocol.committed import CommittedOffsets
from coordinator import metrics
from coordinator.core.fence import commit_refusal, switch_refusal
from coordinator.core.quotas import WHOLE_COORDINATOR, group_refusals, partition_refusals
from coordinator.db import quotas as quota_store
from coordinator.db.switches import accept_individual_commit
from coordinator.errors import KeyrangeError, ServiceUnavailable
from coordinator.offsets import repository
from coordinator.offsets.commit_tracing import CommitTrace
from coordinator.offsets.pacing import PARTITIONS_PER_TURN
from coordinator.offsets.schemas import CommitRequest
from coordinator.offsets.service import (
    CommitResult,
    CommitTally,
    apply_request,
    apply_small_request,
)
from coordinator.settings import Settings

log = logging.getLogger(__name__)

# A request re-run alone is undecided again only if yet another transaction created its group
# in the meantime; past this many attempts the client is told to retry.
_ATTEMPTS_ALONE = 3


class _Pending:
    """A queued request and the future its submitter awaits."""

    # Slots and a plain constructor: one is made per commit request.
    __slots__ = ("group_id", "reply", "request", "scope", "trace")

    def __init__(
        self,
        group_id: str,
        request: CommitRequest,
        # The tenant whose group cap the group counts against, should this commit create it.
        scope: str,
        # Its spans while tracing is on (``coordinator.offsets.commit_tracing``).
        trace: CommitTrace | None = None,
    ) -> None:
        self.group_id = group_id
        self.request = request
        self.scope = scope
        self.trace = trace
        self.reply: asyncio.Future[CommitResult] = asyncio.get_running_loop().create_future()


class _Undecided:
    """A request the batch cannot decide, re-run as a batch of one."""


_UNDECIDED = _Undecided()


class _NewGroup:
    """An admissible standalone commit to a group that does not exist yet: the batch creates
    the group, within its tenant's cap, and then decides it."""


_NEW_GROUP = _NewGroup()

Outcome = CommitResult | KeyrangeError | _Undecided


class CommitBatcher:
    """Queue of commit requests drained by a few workers, one transaction per drained batch.

    ``commit_batch_workers`` transactions may be in flight at once, so the coordinator computes
    one batch while the database works on another; each holds one pooled connection while the
    queue has work.
    """

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self._engine = engine
        self._settings = settings
        self._max_batch = settings.commit_batch_max_requests
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._worker_count = settings.commit_batch_workers
        self._idle_workers = 0
        self._written = repository.WrittenStates()

    @property
    def idle_workers(self) -> int:
        """Workers waiting for a request (tests wait for all of them before they submit)."""
        return self._idle_workers

    def start(self) -> None:
        self._workers = [
            asyncio.create_task(self._work(), name=f"commit-batcher-{index}")
            for index in range(self._worker_count)
        ]

    async def close(self) -> None:
        """Stop once every queued request has been answered."""
        await self._queue.join()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def submit(
        self,
        group_id: str,
        request: CommitRequest,
        scope: str = WHOLE_COORDINATOR,
        trace: CommitTrace | None = None,
    ) -> CommitResult:
        return await self.enqueue(group_id, request, scope, trace)

    def enqueue(
        self,
        group_id: str,
        request: CommitRequest,
        scope: str = WHOLE_COORDINATOR,
        trace: CommitTrace | None = None,
    ) -> asyncio.Future[CommitResult]:
        """Queue a request; the future its reply is set on. Synchronous, so the HTTP protocol
        can hand a commit over without a task of its own (coordinator/offsets/direct.py)."""
        pending = _Pending(group_id, request, scope, trace)
        self._queue.put_nowait(pending)
        return pending.reply

    async def _work(self) -> None:
        carried: _Pending | None = None
        while True:
            if carried is None:
                self._idle_workers += 1
                try:
                    carried = await self._queue.get()
                finally:
                    self._idle_workers -= 1
            carried = await self._busy_period(carried)

    async def _busy_period(self, first: _Pending) -> _Pending | None:
        """Apply batches on one pooled connection while the queue has work.

        Checking a connection out and back in for every batch cost as much CPU as a tenth of
        the batch's commits. The connection goes back to the pool once the queue is empty, so
        an idle coordinator holds none; after a failed batch, so a broken one is replaced;
        whenever the pool has no connection left, so heartbeats and admin requests waiting
        for one are not starved by workers that keep theirs; and before requests are re-run
        alone, because each takes a connection of its own and a worker holding two could
        wait on the pool for ever. Returns a request taken from the queue but not applied
        yet, if any.
        """
        # Taken before the pool is asked: while this worker waits for a connection, idle
        # workers would split the queue into smaller batches.
        batch, carried = self._take_batch(first)
        rerun: list[_Pending] = []
        exhausted = False
        try:
            try:
                async with _pooled_asyncpg(self._engine) as connection:
                    try:
                        while True:
                            # A batch that leaves work queued opens the next one's transaction
                            # with its COMMIT, saving the next batch's BEGIN round trip.
                            then_begin = carried is not None or not self._queue.empty()
                            # A failed batch leaves its requests to be re-run: it ends here.
                            rerun = await self._run(batch, connection, then_begin)
                            exhausted = self._pool_exhausted()
                            if rerun or exhausted:
                                break
                            self._account(batch)
                            batch = []
                            if carried is None:
                                if self._queue.empty():
                                    break
                                carried = self._queue.get_nowait()
                            batch, carried = self._take_batch(carried)
                    finally:
                        await _end_opened_transaction(connection)
            except _NoConnection as exc:
                log.warning(
                    "no database connection for batched commits; trying them one by one",
                    extra={"requests": len(batch), "error": type(exc.__cause__).__name__},
                )
                rerun = batch
            if rerun:
                await asyncio.gather(*(self._rerun_alone(pending) for pending in rerun))
            elif exhausted:
                # The pool's queue wakes its first waiter, but whoever asks before that waiter
                # runs takes the connection: this worker, at once, unless it yields first.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            for pending in [*batch, *([carried] if carried else [])]:
                if not pending.reply.done():
                    pending.reply.cancel()
            raise
        finally:
            self._account(batch)
        return carried

    def _pool_exhausted(self) -> bool:
        pool = self._engine.sync_engine.pool
        limit = self._settings.db_pool_size + self._settings.db_max_overflow
        return isinstance(pool, QueuePool) and pool.checkedout() >= limit

    def _take_batch(self, first: _Pending) -> tuple[list[_Pending], _Pending | None]:
        """``first`` and what follows it in the queue, up to a fair share and the size bounds;
        the request that would have crossed a bound comes back apart."""
        batch = [first]
        # A fair share of the queue when other workers wait for work: their transactions
        # then overlap this one's instead of idling through it.
        share = min(self._max_batch, -(-(1 + self._queue.qsize()) // (1 + self._idle_workers)))
        # Bounded like one request may be, so a batch never holds more locks, or runs
        # longer statements, than the largest single commit could.
        partitions, ranges = _size(first)
        while len(batch) < share and not self._queue.empty():
            pending = self._queue.get_nowait()
            more_partitions, more_ranges = _size(pending)
            partitions += more_partitions
            ranges += more_ranges
            if (
                partitions > self._settings.max_partitions_per_request
                or ranges > self._settings.max_ranges_per_request
            ):
                return batch, pending
            batch.append(pending)
        return batch, None

    def _account(self, batch: list[_Pending]) -> None:
        for _ in batch:
            self._queue.task_done()

    async def _transaction(
        self, batch: list[_Pending], connection: asyncpg.Connection, then_begin: bool = False
    ) -> list[Outcome]:
        tally = CommitTally()
        started_ns = time.time_ns()
        async with _begun(connection):
            outcomes, changed = await self._decide_and_apply(connection, batch, tally)
            await repository.write_and_commit(connection, changed, self._written, then_begin)
        # Counted once the transaction committed: a failed batch's requests are re-run.
        tally.add_to_metrics()
        traced = [pending.trace for pending in batch if pending.trace is not None]
        if traced:
            ended_ns = time.time_ns()
            for trace in traced:
                trace.applied(started_ns, ended_ns, len(batch))
        return outcomes

    async def _run(
        self, batch: list[_Pending], connection: asyncpg.Connection, then_begin: bool
    ) -> list[_Pending]:
        """Apply ``batch`` in one transaction on ``connection`` and answer what it decided;
        with ``then_begin``, leave the next batch's transaction open once it committed.

        Returns the requests to re-run alone: those it could not decide, or all of them when
        it failed. Re-runs are not batches of the queue: their own counter counts them.
        """
        metrics.COMMIT_BATCH_SIZE.observe(len(batch))
        try:
            outcomes = await self._transaction(batch, connection, then_begin)
        except Exception as exc:
            log.warning(
                "batched commit failed; re-running its requests one by one",
                extra={"requests": len(batch), "error": type(exc).__name__},
            )
            return batch
        return [
            pending
            for pending, outcome in zip(batch, outcomes, strict=True)
            if not _answer(pending, outcome)
        ]

    async def _rerun_alone(self, pending: _Pending) -> None:
        """Decide ``pending`` as a batch of one, in a transaction of its own; whatever goes
        wrong now is the request's answer."""
        metrics.COMMITS_RERUN_ALONE.inc()
        try:
            for _ in range(_ATTEMPTS_ALONE):
                async with _pooled_asyncpg(self._engine) as connection:
                    (outcome,) = await self._transaction([pending], connection)
                if _answer(pending, outcome):
                    return
            raise ServiceUnavailable(
                f"group '{pending.group_id}' was being created by another request; retry"
            )
        except _NoConnection as exc:
            _settle(pending, exception=exc.__cause__)
        except Exception as exc:  # delivered to the request, which renders it
            _settle(pending, exception=exc)

    async def _decide_and_apply(
        self, connection: asyncpg.Connection, batch: list[_Pending], tally: CommitTally
    ) -> tuple[list[Outcome], dict[repository.GroupPartitionKey, CommittedOffsets]]:
        """Each request's outcome, and the new states the admitted ones leave (for the caller
        to write and commit)."""
        standalone_groups: set[str] = set()
        committing_members: set[tuple[str, str]] = set()
        requested: set[repository.GroupPartitionKey] = set()
        for pending in batch:
            group_id = pending.group_id
            member_id = pending.request.member_id
            if member_id is None:
                standalone_groups.add(group_id)
            else:
                committing_members.add((group_id, member_id))
            requested.update(
                [(group_id, entry.topic, entry.partition) for entry in pending.request.partitions]
            )
        read = await repository.lock_batch(
            connection, standalone_groups, committing_members, requested
        )
        committers = read.committers
        switch = accept_individual_commit(committers.stored_switch, self._settings)
        refusals: list[KeyrangeError | _Undecided | _NewGroup | None] = [
            _refusal(pending, switch, committers) for pending in batch
        ]
        new_groups = [p for p, r in zip(batch, refusals, strict=True) if r is _NEW_GROUP]
        if new_groups:
            # Creating a group takes its tenant's cap lock, which every transaction takes
            # before any partition row lock: a batch that holds some already leaves its new
            # groups to be created by their requests alone.
            created = (
                await _create_groups(connection, new_groups, self._settings.max_groups_per_prefix)
                if not read.rows
                else dict.fromkeys((p.group_id for p in new_groups), _UNDECIDED)
            )
            refusals = [
                created[p.group_id] if r is _NEW_GROUP else r
                for p, r in zip(batch, refusals, strict=True)
            ]
        outcomes: list[Outcome] = [
            r if isinstance(r, KeyrangeError | _Undecided) else _UNDECIDED for r in refusals
        ]
        admitted = [(index, p) for index, p in enumerate(batch) if refusals[index] is None]
        keys = (
            requested
            if len(admitted) == len(batch)
            else {
                (pending.group_id, entry.topic, entry.partition)
                for _, pending in admitted
                for entry in pending.request.partitions
            }
        )
        locked = await repository.states_of(read.rows, keys, self._written)
        if len(locked) < len(keys):
            admitted = await _add_partitions(
                connection, admitted, locked, outcomes, self._settings.max_partitions_per_group
            )
        changed: dict[repository.GroupPartitionKey, CommittedOffsets] = {}
        tally.requests = len(admitted)
        settings = self._settings
        for index, pending in admitted:
            request = pending.request
            outcomes[index] = (
                apply_small_request(pending.group_id, request, locked, changed, settings, tally)
                if len(request.partitions) <= PARTITIONS_PER_TURN
                else await apply_request(
                    pending.group_id, request, locked, changed, settings, tally
                )
            )
        return outcomes, changed


async def _add_partitions(
    connection: asyncpg.Connection,
    admitted: list[tuple[int, _Pending]],
    locked: dict[repository.GroupPartitionKey, CommittedOffsets],
    outcomes: list[Outcome],
    max_partitions_per_group: int,
) -> list[tuple[int, _Pending]]:
    """Create the partition rows admitted requests name for the first time, within their
    groups' caps, adding them to ``locked``; a request past its group's cap is refused
    whole (in ``outcomes``) and left out of the admitted requests returned."""
    growing = {
        pending.group_id
        for _, pending in admitted
        for entry in pending.request.partitions
        if (pending.group_id, entry.topic, entry.partition) not in locked
    }
    stored = await quota_store.lock_partition_growth(connection, growing)
    # Rows another transaction added before the lock was granted are stored, not new.
    missing = {
        (pending.group_id, entry.topic, entry.partition)
        for _, pending in admitted
        if pending.group_id in growing
        for entry in pending.request.partitions
    } - locked.keys()
    locked.update(await repository.lock_existing(connection, missing))
    adding = [
        (
            pending.group_id,
            {
                (entry.topic, entry.partition)
                for entry in pending.request.partitions
                if (pending.group_id, entry.topic, entry.partition) not in locked
            },
        )
        for _, pending in admitted
    ]
    refusals = partition_refusals(adding, stored, max_partitions_per_group)
    still: list[tuple[int, _Pending]] = []
    new_rows: set[repository.GroupPartitionKey] = set()
    for (index, pending), (group_id, partitions), refused in zip(
        admitted, adding, refusals, strict=True
    ):
        if refused is not None:
            outcomes[index] = refused
            continue
        still.append((index, pending))
        new_rows.update((group_id, topic, partition) for topic, partition in partitions)
    if new_rows:
        locked.update(await repository.create_partitions(connection, new_rows))
    return still


async def _create_groups(
    connection: asyncpg.Connection, pending: list[_Pending], max_groups_per_prefix: int
) -> dict[str, KeyrangeError | _Undecided | None]:
    """Create the groups of admissible standalone commits, within their tenants' caps: None
    for a group this transaction created (its commits are admitted: it has no members), the
    refusal for one past its cap, undecided for one another transaction is creating."""
    wanted = [(p.group_id, p.scope) for p in pending]
    stored = await quota_store.lock_scopes(connection, {scope for _, scope in wanted})
    decided = group_refusals(wanted, stored, max_groups_per_prefix)
    created = await quota_store.create_groups(
        connection, [group_id for group_id, refused in decided.items() if refused is None]
    )
    return {
        group_id: refused if refused is not None or group_id in created else _UNDECIDED
        for group_id, refused in decided.items()
    }


class _NoConnection(Exception):
    """The pool could not give a connection; the cause says why."""


@contextlib.asynccontextmanager
async def _pooled_asyncpg(engine: AsyncEngine) -> AsyncIterator[asyncpg.Connection]:
    """A pooled connection's asyncpg connection.

    Commits run on the driver connection: at the rates batching is for, SQLAlchemy's
    per-statement work would cost more than the statements. The settings only accept the
    asyncpg driver.
    """
    connection = engine.connect()
    try:
        await connection.start()
    except Exception as exc:
        raise _NoConnection from exc
    try:
        raw = await connection.get_raw_connection()
        yield cast(asyncpg.Connection, raw.driver_connection)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def _begun(connection: asyncpg.Connection) -> AsyncIterator[None]:
    """A transaction the body ends itself (``repository.write_and_commit`` commits along with
    the write, saving a round trip), rolled back if the body fails before it committed. The
    previous batch on the connection may have opened it already, with its ``COMMIT``."""
    if not connection.is_in_transaction():
        await connection.execute("BEGIN;")
    try:
        yield
    except BaseException:
        if connection.is_in_transaction() and not connection.is_closed():
            await connection.execute("ROLLBACK;")
        raise


async def _end_opened_transaction(connection: asyncpg.Connection) -> None:
    """Roll back a transaction a batch opened for a next batch that did not come (the pool
    ran out, or a batch failed), so the connection goes back to the pool idle."""
    if connection.is_in_transaction() and not connection.is_closed():
        await connection.execute("ROLLBACK;")


def _refusal(
    pending: _Pending, switch: bool, committers: repository.Committers
) -> KeyrangeError | _NewGroup | None:
    """Why ``pending`` may not be applied in this batch; None when it is admitted, and
    ``_NEW_GROUP`` when it would be once its group exists."""
    request = pending.request
    # A loop, not ``any`` over a generator: this runs for every request of every batch.
    individual = False
    for entry in request.partitions:
        if entry.ranges or entry.watermarks:
            individual = True
            break
    if request.member_id is None and pending.group_id not in committers.live_members:
        return switch_refusal(individual, switch) or _NEW_GROUP
    return commit_refusal(
        pending.group_id,
        request.member_id,
        request.member_epoch,
        individual=individual,
        accept_individual_commit=switch,
        live_members=committers.live_members.get(pending.group_id, 0),
        standing=committers.standings.get((pending.group_id, request.member_id or "")),
    )


def _answer(pending: _Pending, outcome: Outcome) -> bool:
    """Settle ``pending`` with ``outcome``; False when the outcome is that it is undecided."""
    if isinstance(outcome, _Undecided):
        return False
    if isinstance(outcome, KeyrangeError):
        _settle(pending, exception=outcome)
    else:
        _settle(pending, result=outcome)
    return True


def _size(pending: _Pending) -> tuple[int, int]:
    entries = pending.request.partitions
    return len(entries), sum(len(e.ranges) + len(e.watermarks) for e in entries)


def _settle(
    pending: _Pending,
    *,
    result: CommitResult | None = None,
    exception: BaseException | None = None,
) -> None:
    if pending.reply.done():  # the request went away (client disconnected, shutdown)
        return
    if exception is not None:
        pending.reply.set_exception(exception)
    else:
        pending.reply.set_result(result)  # type: ignore[arg-type]
