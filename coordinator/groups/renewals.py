"""Stable heartbeats' session renewals, many to a statement.

With prompt hand-offs every stable member keeps a heartbeat open and renews it every
interval: 10,000 members on one replica are 3,300 renewals a second, each of which was a
statement of its own, with its round trip, its pooled connection and its share of the
driver's and the database's per-statement work. Renewals that arrive while a statement is
in flight wait for the next one, which carries them all (as commits are grouped, see
docs/offsets.md): the cost per heartbeat falls as the load rises, and a renewal waits at
most one statement longer than it did alone. What each renewal decides is unchanged: the
statement applies the same guard to every row (``repository.renew_stable_sessions``).
"""

from __future__ import annotations

import asyncio
from typing import cast

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.groups import repository

# Statements in flight at once, each on one pooled connection: two, so that a batch is
# gathered while the other is in the database.
WORKERS = 2
# Renewals per statement at most; a statement of this many takes a few milliseconds.
MAX_BATCH = 512

_Pending = tuple[repository.Renewal, "asyncio.Future[repository.StableHeartbeat | None]"]


class SessionRenewals:
    """Renewals of one engine's database, batched. Needs no start or stop: a worker runs
    while renewals are queued and ends when the queue is empty."""

    def __init__(self, engine: AsyncEngine) -> None:
        # Autocommit: one statement, no transaction to begin and commit around it.
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._queue: list[_Pending] = []
        self._workers: set[asyncio.Task[None]] = set()

    async def renew(self, renewal: repository.Renewal) -> repository.StableHeartbeat | None:
        """The member's renewed session, or None when the heartbeat needs the locked path."""
        return await self.enqueue(renewal)

    def enqueue(
        self, renewal: repository.Renewal
    ) -> asyncio.Future[repository.StableHeartbeat | None]:
        """:meth:`renew`'s outcome as a future, for a caller that cannot await
        (``coordinator/groups/direct.py``)."""
        future: asyncio.Future[repository.StableHeartbeat | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._queue.append((renewal, future))
        if len(self._workers) < WORKERS:
            worker = asyncio.create_task(self._work())
            self._workers.add(worker)
            worker.add_done_callback(self._workers.discard)
        return future

    async def _work(self) -> None:
        while self._queue:
            batch = self._queue[:MAX_BATCH]
            del self._queue[:MAX_BATCH]
            await self._renew(batch)

    async def _renew(self, batch: list[_Pending]) -> None:
        try:
            async with self._engine.connect() as connection:
                raw = await connection.get_raw_connection()
                renewed = await repository.renew_stable_sessions(
                    cast(asyncpg.Connection, raw.driver_connection),
                    [renewal for renewal, _ in batch],
                )
        except Exception as exc:
            # Every request of the batch fails as its own statement would have.
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), stable in zip(batch, renewed, strict=True):
            if not future.done():
                future.set_result(stable)
