"""Heartbeats of one group that need its row lock take turns in the process before they take
a pooled database connection.

The locked path (a join, a leave, a rebalance, any heartbeat that changes more than its own
member row) runs under the group's row lock, so those heartbeats run one at a time whatever
happens here; the rest take no turn (``heartbeat.unlocked_heartbeat``). Without turns, each
would wait for that lock inside its transaction, holding a pooled connection doing nothing: a
join into a group of 100 waiting members wakes the ones it retargets, their heartbeats queue on
the one lock, and the pool (20 by default) is gone for every other group, stable renewals
included. With turns, a replica's requests wait for the group's lock in memory and hold a
connection only while they work; the row lock still orders them against other replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class GroupTurns:
    """One ``asyncio.Lock`` per group with requests waiting or running, dropped with the
    last of them."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, group_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(group_id, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[group_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            _, users = self._locks[group_id]
            if users == 1:
                del self._locks[group_id]
            else:
                self._locks[group_id] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
