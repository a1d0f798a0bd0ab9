"""Committing what was marked processed to the coordinator: now (``commit``), periodically, and
early when the uncommitted ranges reach ``max_num_ranges_to_commit``.

The tracker builds each request (``client.tracker``); this part sends it with the member's
identity and handles the two answers a commit can recover from: a coordinator that refuses
individual commits (fall back to classic offsets) and an epoch that moved on (refresh it once).
A member whose session is lost commits nothing: its slices may already be another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from client.errors import (
    FencedMemberEpoch,
    IndividualCommitNotAllowed,
    KeyrangeClientError,
    UnknownMemberId,
)
from client.http import CoordinatorClient, Limits
from client.membership import Membership
from client.tracker import OffsetTracker

logger = logging.getLogger(__name__)


class Committer:
    """Sends the tracker's progress for one group; ``membership`` is None when standalone."""

    def __init__(
        self,
        client: CoordinatorClient,
        group_id: str,
        tracker: OffsetTracker,
        *,
        may_commit: Callable[[], bool],
    ) -> None:
        self._client = client
        self._group_id = group_id
        self._tracker = tracker
        self._may_commit = may_commit
        self.membership: Membership | None = None
        # Learned from the coordinator before the first commit (``GET /v1/limits``).
        self._max_ranges: int | None = None
        self._lock = asyncio.Lock()
        self._soon: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def learn(self, limits: Limits) -> None:
        """The coordinator's limits, when already asked (``start()`` asks them to know the
        coordinator answers), so the first commit need not ask again."""
        self._max_ranges = limits.max_ranges_per_request

    def start(self, interval_s: float | None) -> None:
        self._task = asyncio.create_task(
            self._commit_periodically(interval_s), name="keyrange-auto-commit"
        )

    async def stop(self) -> None:
        """Stop the periodic commits (a final ``commit`` is the caller's)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def request(self) -> None:
        """Commit soon, without waiting for the interval."""
        if self._soon is not None and not self._soon.done():
            self._soon.set_result(None)

    async def commit(self, *, raise_errors: bool) -> None:
        async with self._lock:
            try:
                await self._commit_locked()
            except KeyrangeClientError as error:
                if raise_errors:
                    raise
                logger.warning(
                    "commit failed; progress is kept for the next commit",
                    extra={"group_id": self._group_id, "error": str(error)},
                )

    async def _commit_periodically(self, interval_s: float | None) -> None:
        """Commit every ``interval_s`` (never, with None) and whenever ``request`` is called,
        which applies even without periodic commits."""
        next_at = None if interval_s is None else time.monotonic() + interval_s
        while True:
            self._soon = asyncio.get_running_loop().create_future()
            timeout = None if next_at is None else max(next_at - time.monotonic(), 0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._soon), timeout)
            if interval_s is not None:
                next_at = time.monotonic() + interval_s
            await self.commit(raise_errors=False)

    async def _commit_locked(self) -> None:
        refreshed = False
        membership = self.membership
        if self._max_ranges is None:
            self._max_ranges = (await self._client.limits()).max_ranges_per_request
        while True:
            batch = self._tracker.prepare_commit(max_ranges=self._max_ranges)
            if batch is None:
                return
            if not self._may_commit():
                raise UnknownMemberId("the session was lost; nothing committed")
            member_id, member_epoch = (None, None) if membership is None else membership.identity()
            if membership is not None and member_id is None:
                raise UnknownMemberId("not a member of the group (joining); nothing committed")
            try:
                replies = await self._client.commit(
                    self._group_id,
                    batch.partitions,
                    member_id=member_id,
                    member_epoch=member_epoch,
                )
            except IndividualCommitNotAllowed:
                # The coordinator runs with accept.individual.commit off: whole partitions
                # can still commit a classic offset (their lowest unprocessed record).
                if self._tracker.mode == "offset":
                    raise
                logger.warning(
                    "the coordinator refuses individual commits; committing classic offsets",
                    extra={"group_id": self._group_id},
                )
                self._tracker.mode = "offset"
                continue
            except FencedMemberEpoch:
                # The epoch moved on (an assignment change); refresh it once and retry the
                # slices still held. A second fence means the slices are gone.
                if membership is None or refreshed:
                    raise
                refreshed = True
                if not await membership.refresh():
                    raise
                continue
            for refused in self._tracker.commit_succeeded(batch, replies):
                logger.warning(
                    "commit refused for a partition",
                    extra={
                        "group_id": self._group_id,
                        "topic": refused.topic,
                        "partition": refused.partition,
                        "error": refused.error,
                    },
                )
            return
