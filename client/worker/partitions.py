"""The tasks of owned partitions: created when a partition is owned, so they punctuate
before its first record; punctuated every ``punctuate_interval_s``; closed, each after its
current call, when the member no longer owns any slice of the partition and at shutdown. A
lane whose task is still in a call when the drain timeout passes is kept until that call
ends and the task is closed, so one sub-partition never has two tasks running at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Protocol

from aiokafka.structs import TopicPartition

from client.worker.config import WorkerConfig
from client.worker.forms import Form
from client.worker.lanes import Lane, LaneId
from client.worker.lifecycle import Lifecycle

logger = logging.getLogger(__name__)


class LaneSet(Protocol):
    """The runtime's lanes, as the task lifecycle changes them."""

    lanes: dict[LaneId, Lane]

    def new_lane(self, ident: LaneId) -> Lane | None: ...

    def schedule(self, lane: Lane) -> None: ...


class PartitionTasks:
    """Opens, punctuates and closes the lanes' tasks."""

    def __init__(
        self,
        lanes: LaneSet,
        form: Form,
        lifecycle: Lifecycle,
        config: WorkerConfig,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._lanes = lanes
        self._form = form
        self._lifecycle = lifecycle
        self._config = config
        self._loop = loop

    def open_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Create the tasks of newly owned partitions now, so they punctuate before their
        first record arrives."""
        if self._lifecycle.stopping:
            return
        for tp in partitions:
            for ident in self._form.lanes_of(tp):
                if ident not in self._lanes.lanes:
                    self._lanes.new_lane(ident)

    async def close_partitions(self, partitions: set[TopicPartition]) -> None:
        """Close the tasks of partitions this member no longer owns any slice of, each after
        its current call, within the drain timeout."""
        if self._lifecycle.stopping:
            return  # the shutdown closes every task
        lanes = [lane for lane in self._lanes.lanes.values() if lane.ident[0] in partitions]
        await self._close_lanes(lanes)

    async def close_all(self, deadline: float | None) -> None:
        """At shutdown, by ``deadline`` (monotonic) but at least a second from now."""
        lanes = self._form.closed_at_shutdown(self._lanes.lanes.values())
        if not lanes:
            return
        remaining = None if deadline is None else max(deadline - time.monotonic(), 1.0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                await self._close_lanes(lanes)

    async def _close_lanes(self, lanes: list[Lane]) -> None:
        waits: list[asyncio.Future[None]] = []
        for lane in lanes:
            if lane.closed is None:
                lane.closed = self._loop.create_future()
                self._lanes.schedule(lane)
            waits.append(lane.closed)
        if waits:
            _, late = await asyncio.wait(waits, timeout=self._config.drain_timeout_s)
            for lane in lanes:
                if lane.closed in late:
                    # Its task is still in a call: the lane stays (a re-acquired partition's
                    # records wait in it) until the call ends and the task is closed, so one
                    # sub-partition never has two tasks running at once.
                    logger.warning("task not closed in time", extra={"lane": str(lane.ident)})

    async def close_task(self, lane: Lane) -> None:
        """The turn of a lane being closed: its task's ``close``, then the lane goes; records
        that came meanwhile (the partition was granted again) go to a new task."""
        await self._form.call(lane, "close")
        assert lane.closed is not None
        if not lane.closed.done():
            lane.closed.set_result(None)
        if self._lanes.lanes.get(lane.ident) is lane:
            del self._lanes.lanes[lane.ident]
            if lane.queue and not self._lifecycle.stopping:
                # The partition was granted again while the task closed: a new task takes
                # the records that waited.
                heir = self._lanes.new_lane(lane.ident)
                if heir is not None:
                    heir.queue = lane.queue
                    self._lanes.schedule(heir)

    async def punctuate_periodically(self) -> None:
        interval = self._config.punctuate_interval_s
        while True:
            await asyncio.sleep(interval)
            if not self._form.punctuates:
                return
            for lane in list(self._lanes.lanes.values()):
                if self._form.calls(lane.task, "punctuate") and lane.closed is None:
                    lane.punctuate_due = True
                    self._lanes.schedule(lane)
