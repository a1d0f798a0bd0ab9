"""Standby key ranges (docs/streams.md, "Standby key ranges"): warm copies of other
instances' key ranges, kept by tailing their changelog partitions filtered by range.

Every ``refresh_s`` the group's ownership is read from the coordinator and
``standby_plan.standby_ranges`` names this instance's standbys; ranges this instance holds an
active task over are never standbys. Every ``interval_s`` each standby's stores are read on
from where they stood to the changelog's high watermark, through a restorer of their own
(``client.streams.restore``, the same C key filter as a restore), so a standby's catch-up
never holds up an active task's restore. A standby never processes a record, never writes a
changelog and owns nothing: it writes its local store and its checkpoint offset
(``StateManager.standby_at``), which is where a restore of the range starts once this
instance is given it (``release``): only the tail is read.

Whenever the set of standbys changes, it is reported (``report``) as slices of every source
topic of each standby's sub-topology, for the coordinator's assignor to hand this instance
those ranges when their owner goes (docs/streams.md, "Standby key ranges").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka.structs import TopicPartition

from client.errors import KeyrangeClientError
from client.http import GroupOwners, Slices
from client.protocol.keyspace import KeyRange
from client.streams.errors import StreamsError
from client.streams.ports import StoreRestorer
from client.streams.restore import RestoreProgress
from client.streams.standby_plan import standby_ranges
from client.streams.state import StateManager
from client.streams.task import TaskId
from client.streams.topology import BuiltTopology
from client.streams.window_store import WindowBackend

logger = logging.getLogger(__name__)


class StandbyMember(Protocol):
    """The group member the standbys belong to (the app's consumer): who it is, and where it
    tells the coordinator what it keeps."""

    @property
    def member_id(self) -> str | None: ...

    def report_standbys(self, standbys: Slices) -> None: ...


@dataclass
class StandbyStatus:
    """One standby range's stores: where each stands in its changelog, the high watermark
    its last read saw, and the records it wrote since it started."""

    positions: dict[str, int] = field(default_factory=dict)
    ends: dict[str, int] = field(default_factory=dict)
    restored: dict[str, int] = field(default_factory=dict)

    def lag(self) -> int:
        """Changelog records behind the last high watermark seen, over its stores."""
        return sum(max(0, end - self.positions.get(store, 0)) for store, end in self.ends.items())


class Standbys:
    def __init__(
        self,
        *,
        topology: BuiltTopology,
        application_id: str,
        state: StateManager,
        restorer: StoreRestorer,
        owners: Callable[[], Awaitable[GroupOwners]],
        member: StandbyMember,
        active: Callable[[], list[TaskId]],
        replicas: int,
        interval_s: float = 0.2,
        refresh_s: float = 1.0,
    ) -> None:
        self._topology = topology
        self._application_id = application_id
        self._state = state
        self._restorer = restorer
        self._owners = owners
        self._member = member
        self._active = active
        self._replicas = replicas
        self._interval_s = interval_s
        self._refresh_s = refresh_s
        self.standbys: dict[TaskId, StandbyStatus] = {}
        # The pass under way and the standby it reads now: ``release`` cancels it when that
        # standby becomes active here, so the tailing never writes under an active restore.
        self._pass: asyncio.Task[None] | None = None
        self._tailing: tuple[TaskId, str, RestoreProgress] | None = None

    async def run(self) -> None:
        """Plan and tail until cancelled."""
        planned_at = -float("inf")
        try:
            while True:
                if time.monotonic() - planned_at >= self._refresh_s:
                    planned_at = time.monotonic()
                    await self._replan()
                self._pass = asyncio.ensure_future(self._tail_all())
                await asyncio.wait([self._pass])
                done, self._pass = self._pass, None
                if not done.cancelled() and done.exception() is not None:
                    # A standby is a cache: its failure never stops the processing, and the
                    # next pass reads on from the offsets kept.
                    logger.error("standby pass failed", exc_info=done.exception())
                await asyncio.sleep(self._interval_s)
        finally:
            if self._pass is not None:
                self._pass.cancel()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per standby range, as ``StreamsApp.standby_status`` gives it."""
        return {
            str(task_id): {
                "positions": dict(status.positions),
                "ends": dict(status.ends),
                "restored": dict(status.restored),
                "lag": status.lag(),
            }
            for task_id, status in self.standbys.items()
        }

    def release(self, task_id: TaskId) -> None:
        """An active task over ``task_id`` opens here: its standbys stop now (before the
        task's restore starts), their offsets stay for that restore to read on from."""
        for standby in [other for other in self.standbys if _overlap(other, task_id)]:
            if self._tailing is not None and self._tailing[0] == standby:
                _, store, progress = self._tailing
                self._state.standby_at(store, standby.partition, standby.keys, progress.position)
                if self._pass is not None:
                    self._pass.cancel()
                self._tailing = None
            self.standbys.pop(standby)
            self._untail(standby)
            logger.info("standby becomes active", extra={"task": str(standby)})
        self._member.report_standbys(self.slices())

    def slices(self) -> Slices:
        """The standbys kept now, on every source topic of their sub-topology: the group's
        co-partitioned topics, any of which names the partition number to the assignor."""
        slices: Slices = {}
        for task_id in self.standbys:
            sub = self._topology.subtopologies[task_id.subtopology]
            for topic in sub.source_topics:
                slices.setdefault(TopicPartition(topic, task_id.partition), []).append(task_id.keys)
        return slices

    async def _replan(self) -> None:
        member_id = self._member.member_id
        if member_id is None:
            return
        try:
            owners = await self._owners()
        except (KeyrangeClientError, OSError, TimeoutError) as error:
            logger.warning("standby plan not refreshed", extra={"error": str(error)})
            return
        owned = [
            (topic, partition, start, end, owner.member_id)
            for topic, partition, start, end, owner in owners.owned
        ]
        active = self._active()
        wanted: set[TaskId] = set()
        for topic, partition, keys in standby_ranges(owned, member_id, self._replicas):
            sub = self._topology.subtopology_of_topic(topic)
            task_id = TaskId(sub.index, partition, keys)
            if sub.stores and not any(_overlap(task_id, other) for other in active):
                wanted.add(task_id)
        # A standby no longer named is dropped once another member owns its keys: while
        # nobody does (its owner died and the coordinator has not given its range to anyone
        # yet) it is kept, as it is the copy that range's next owner here restores on from.
        others = [
            TaskId(
                self._topology.subtopology_of_topic(topic).index, partition, KeyRange(start, end)
            )
            for topic, partition, start, end, owner in owned
            if owner != member_id
        ]
        for gone in [standby for standby in self.standbys if standby not in wanted]:
            if any(_overlap(gone, other) for other in others):
                self._drop(gone, delete=not any(_overlap(gone, other) for other in active))
        for task_id in sorted(wanted - set(self.standbys), key=str):
            self.standbys[task_id] = StandbyStatus()
            logger.info("standby created", extra={"task": str(task_id)})
        self._member.report_standbys(self.slices())

    async def _tail_all(self) -> None:
        for task_id in list(self.standbys):
            sub = self._topology.subtopologies[task_id.subtopology]
            for store in sub.stores:
                if task_id not in self.standbys:
                    break
                try:
                    await self._tail(task_id, store)
                except StreamsError as error:
                    # A changelog that lost records: read it again from the start next time.
                    logger.warning(
                        "standby dropped", extra={"task": str(task_id), "error": str(error)}
                    )
                    self._drop(task_id, delete=True)

    async def _tail(self, task_id: TaskId, store: str) -> None:
        status = self.standbys[task_id]
        start = self._state.standby_offset(store, task_id.partition, task_id.keys)
        if start is None:
            start = self._state.restore_from(store, task_id.partition, task_id.keys)
        progress = RestoreProgress(store, task_id.partition, [task_id.keys], start)
        self._tailing = (task_id, store, progress)
        backend = self._state.backend(store, task_id.partition)
        if isinstance(backend, WindowBackend):
            # Expiry by this range's own clock, not by the other ranges on the engine.
            backend = backend.tail(task_id.keys)
        try:
            await self._restorer.restore(
                self._topology.stores[store].changelog_topic(self._application_id),
                progress,
                backend,
            )
        finally:
            if self._tailing is not None and self._tailing[2] is progress:
                self._tailing = None
        self._state.standby_at(store, task_id.partition, task_id.keys, progress.position)
        first = store not in status.positions
        status.positions[store] = progress.position
        status.ends[store] = progress.end_offset or progress.position
        status.restored[store] = status.restored.get(store, 0) + progress.restored
        if first:
            logger.info(
                "standby caught up",
                extra={
                    "task": str(task_id),
                    "store": store,
                    "start_offset": start,
                    "records_read": progress.read,
                    "records_restored": progress.restored,
                },
            )

    def _drop(self, task_id: TaskId, *, delete: bool) -> None:
        if self.standbys.pop(task_id, None) is None:
            return
        self._untail(task_id)
        if self._tailing is not None and self._tailing[0] == task_id and self._pass is not None:
            self._pass.cancel()
            self._tailing = None
        sub = self._topology.subtopologies[task_id.subtopology]
        for store in sub.stores:
            self._state.drop_standby(
                self._application_id, store, task_id.partition, task_id.keys, delete=delete
            )
        logger.info("standby closed", extra={"task": str(task_id), "deleted": delete})

    def _untail(self, task_id: TaskId) -> None:
        """A window store's expiry no longer waits for this standby's clock."""
        for store in self._topology.subtopologies[task_id.subtopology].stores:
            backend = self._state.backend(store, task_id.partition)
            if isinstance(backend, WindowBackend):
                backend.untail(task_id.keys)


@contextlib.asynccontextmanager
async def standbys_running(standbys: Standbys | None) -> AsyncIterator[None]:
    """``standbys`` tailing (when there are any) for as long as the block runs."""
    if standbys is None:
        yield
        return
    running = asyncio.create_task(standbys.run(), name="keyrange-streams-standbys")
    try:
        yield
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


def _overlap(one: TaskId, other: TaskId) -> bool:
    return (
        one.subtopology == other.subtopology
        and one.partition == other.partition
        and one.keys.overlaps(other.keys)
    )
