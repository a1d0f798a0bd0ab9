"""What tasks produced, on its way to Kafka: handed to the producer through the ownership gate,
and followed until acknowledged, so the commit protocol marks an input only after everything
it produced is in Kafka.

Records go to the producer as whole record batches, one per topic-partition (aiokafka's
``create_batch``/``send_batch``), not one ``send`` each: a ``send`` costs a future, a metadata
look-up and, on its acknowledgement, a ``RecordMetadata`` per record, which was a third of the
word count's CPU (bench/history/2026-11-26-issue-30-rate-cpu-batched-outputs.md). The wire
is the same: aiokafka's own ``send`` builds these batches too. A partition has one batch handed over
at a time: what a round produced for it waits here while the batch before is unacknowledged,
and goes out with the next round, or when that batch is acknowledged (``wake``), or at a flush
(which waits for each in turn). A partition left with more than a batch's worth waiting after
a hand-over holds the round until no more than that waits, as the producer's own queue held
it before (it took one batch beyond the one in flight). Each partition's records keep their
order: its batches are handed over one after the other's acknowledgement. The producer sends
one request per broker at a time and queued a partition's next batch until the last one was
sent, so the pace is the same.

The gate is asked for every task whose records a batch holds right before the batch is
handed over, with no ``await`` between the question and the hand-over that could suspend:
the partition's previous batch is acknowledged and the topic's metadata known, so the
producer queues the batch at once (aiokafka's ``send_batch`` waits, up to its
``request_timeout_ms``, for an unknown topic's metadata or for the partition's queued batch
to be sent, and a gate's answer given before that wait could be one the session no longer
allows). A task the gate refuses has its records left out of the batch ("outputs withheld").
What remains after the hand-over is the producer's own delivery: a queued batch is written
when its broker can take it, up to ``request_timeout_ms`` later (docs/guarantees.md,
"Exceptions, and how to fence them").

A failed delivery (a batch holding a sink record or a changelog write) is fatal to the
instance, as under Kafka Streams' at-least-once: it is logged at ERROR naming each task with
records in the batch, nothing processed since the last commit is marked from then on (the
runtime stops; whoever takes the keys processes those records again), and the failure is
kept, so no later flush can pass over it: before, a flush that met one failure forgot the
other sends, and the next commit marked inputs whose outputs never reached Kafka. A failed
send of a task already halted by a lost membership is only a warning: its inputs are never
committed by this instance anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError

from client.streams.errors import SendFailed
from client.streams.gate import TaskGate
from client.streams.partitioner import RememberingPartitioner
from client.streams.ports import Batch, Producer
from client.streams.state import StateManager
from client.streams.task import Outgoing, StreamTask, TaskState

logger = logging.getLogger(__name__)

# aiokafka's default ``max_request_size``, which the streams producer keeps (StreamsApp): a
# record larger than this is refused before it is handed over, as ``send`` refuses it.
MAX_REQUEST_SIZE = 1_048_576
# The headers of a record that has none: the batch builder wants a list and never changes it.
_NO_HEADERS: list[tuple[str, bytes]] = []

Partition = tuple[str, int]
Waiting = list[tuple[StreamTask, Outgoing]]


class Outputs:
    """The producer side of the runtime: ``send`` hands tasks' outputs over, ``flush`` waits
    for them and raises ``SendFailed`` once any delivery failed."""

    def __init__(
        self,
        producer: Producer,
        state: StateManager,
        gate: TaskGate,
        on_failure: Callable[[], None],
        wake: Callable[[], None] = lambda: None,
        max_request_size: int = MAX_REQUEST_SIZE,
    ) -> None:
        self._producer = producer
        self._state = state
        self._gate = gate
        self._on_failure = on_failure
        self._wake = wake
        self._max_request_size = max_request_size
        self._partitioner = RememberingPartitioner()
        # Records given to ``send`` and not yet handed over, per topic-partition, in order.
        self._waiting: dict[Partition, Waiting] = {}
        # The delivery of the last batch handed over per topic-partition.
        self._last: dict[Partition, asyncio.Future[Any]] = {}
        # Handed over and not yet looked at, oldest first: deliveries complete about in
        # order, so each ``send`` looks at the done ones at the head.
        self._sends: deque[tuple[tuple[StreamTask, ...], asyncio.Future[Any]]] = deque()
        self._reported: set[StreamTask] = set()
        # Topics whose metadata the producer has: ``send_batch`` queues at once for them.
        self._known: set[str] = set()
        self.failure: SendFailed | None = None

    async def send(self, tasks: Iterable[StreamTask]) -> None:
        """Hand the tasks' outputs over (those of a partition whose last batch is still
        unacknowledged wait for it); ``SendFailed`` once a delivery failed, so a failure stops
        the instance within a round of being known, not at the next commit."""
        self._look_at_done()
        if self.failure is not None:
            raise self.failure
        partitions: dict[str, list[int]] = {}
        waiting = self._waiting
        for task in tasks:
            if not task.outgoing:
                continue
            outgoing, task.outgoing = task.outgoing, []
            for record in outgoing:
                partition = record.partition
                if partition is None:
                    known = partitions.get(record.topic)
                    if known is None:
                        known = partitions[record.topic] = await self._partitions(task, record)
                    partition = self._partitioner(record.key, known, known)
                at = (record.topic, partition)
                queue = waiting.get(at)
                if queue is None:
                    queue = waiting[at] = []
                queue.append((task, record))
        await self._hand_over(everything=False)

    async def _partitions(self, task: StreamTask, record: Outgoing) -> list[int]:
        """The partitions of the record's topic, in order; a topic the producer cannot learn
        (absent, not authorized, no broker within its ``request_timeout_ms``) fails the task
        as a failed send does."""
        try:
            partitions = sorted(await self._producer.partitions_for(record.topic))
        except Exception as error:
            self._fail(task, error)
            raise self.failure or error from error
        self._known.add(record.topic)
        return partitions

    async def flush(self) -> None:
        """Until everything given to ``send`` is acknowledged; ``SendFailed`` if anything
        handed over since the instance started failed (this flush's sends or earlier ones)."""
        if self.failure is None:
            await self._hand_over(everything=True)
            await self._producer.flush()
            self._look_at_done()
        if self.failure is not None:
            raise self.failure

    async def _hand_over(self, *, everything: bool) -> None:
        """Hand over a batch for each partition whose previous delivery is done, and go on
        as those deliveries complete: for every partition waiting at a flush, and otherwise
        for one left with more than another batch's worth waiting (the backpressure the
        producer's own queue gave before: it took one batch beyond the one in flight)."""
        refused: dict[StreamTask, int] = {}
        through: set[Partition] = set(self._waiting) if everything else set()
        try:
            while self.failure is None:
                for at in list(self._waiting):
                    if not self._delivered_last(at):
                        continue
                    if await self._send_one(at, refused):
                        through.add(at)
                    elif not everything:
                        through.discard(at)
                pending = [
                    last
                    for at in through
                    if at in self._waiting
                    and (last := self._last.get(at)) is not None
                    and not last.done()
                ]
                if not pending:
                    return
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                self._look_at_done()
        finally:
            for task, count in refused.items():
                self._withheld(task, count)

    def _delivered_last(self, at: Partition) -> bool:
        """Whether the partition's previous batch is acknowledged, so the producer queues the
        next one at once: aiokafka's ``send_batch`` waits (up to ``request_timeout_ms``)
        while the partition's last batch is queued, and the gate's answer must not age in
        that wait. A failed one lets nothing more go: the failure stops the instance."""
        last = self._last.get(at)
        if last is None:
            return True
        if not last.done():
            return False
        return not last.cancelled() and last.exception() is None

    async def _send_one(self, at: Partition, refused: dict[StreamTask, int]) -> bool:
        """One batch of the partition's waiting records, its tasks asked at the gate right
        before the hand-over, with no ``await`` in between: the topic's metadata is known
        first (``send_batch`` would wait for it), and the partition's previous delivery is
        done (``_delivered_last``). Whether more records are left waiting than this batch
        took (a batch's worth, about)."""
        topic = at[0]
        if topic not in self._known:
            await self._metadata(topic)
        waiting = self._waiting.pop(at)
        batch = self._producer.create_batch()
        members: dict[StreamTask, None] = {}
        changelog = False
        index = 0
        for task, record in waiting:
            if task in refused:
                refused[task] += 1
            elif task not in members and not self._gate.may_send(task):
                refused[task] = 1
            elif (
                batch.append(
                    timestamp=None,
                    key=record.key,
                    value=record.value,
                    headers=list(record.headers) if record.headers else _NO_HEADERS,
                )
                is None
            ):
                break
            else:
                members[task] = None
                changelog = changelog or record.changelog_of is not None
            index += 1
        left = len(waiting) - index
        if left:
            del waiting[:index]
            self._waiting[at] = waiting
        if batch.record_count():
            await self._send_batch(at, batch, tuple(members), changelog)
        return left > index

    async def _metadata(self, topic: str) -> None:
        """Learn the topic's partitions before any gate is asked for it (a sink's come with
        its first record, a changelog's here); a topic the producer cannot learn fails the
        tasks waiting for it as a failed send does."""
        try:
            await self._producer.partitions_for(topic)
        except Exception as error:
            tasks = {
                task: None
                for at, waiting in self._waiting.items()
                if at[0] == topic
                for task, _ in waiting
            }
            for task in tasks:
                self._fail(task, error)
            raise self.failure or error from error
        self._known.add(topic)

    async def _send_batch(
        self, at: Partition, batch: Batch, tasks: tuple[StreamTask, ...], changelog: bool
    ) -> None:
        count = batch.record_count()
        try:
            if count == 1 and batch.size() > self._max_request_size:
                raise MessageSizeTooLargeError(
                    f"a record of {batch.size()} bytes is larger than the producer's "
                    f"max_request_size ({self._max_request_size})"
                )
            batch.close()
            delivery = await self._producer.send_batch(batch, at[0], partition=at[1])
        except Exception as error:
            # Refused before it was queued (too large, the producer closed): the same
            # failure as a delivery that failed later.
            for task in tasks:
                self._fail(task, error)
            raise self.failure or error from error
        if changelog:
            delivery.add_done_callback(lambda done: self._note_written(done, count))
        delivery.add_done_callback(self._delivered)
        self._last[at] = delivery
        self._sends.append((tasks, delivery))

    def _look_at_done(self) -> None:
        sends = self._sends
        while sends and sends[0][1].done():
            tasks, delivery = sends.popleft()
            error = asyncio.CancelledError() if delivery.cancelled() else delivery.exception()
            if error is not None:
                for task in tasks:
                    self._fail(task, error)

    def _delivered(self, delivery: asyncio.Future[Any]) -> None:
        """Records that waited for this batch's acknowledgement may go now: wake the runtime
        rather than leave them to its next tick."""
        if self._waiting:
            self._wake()

    def _note_written(self, delivery: asyncio.Future[Any], count: int) -> None:
        if delivery.cancelled() or delivery.exception() is not None:
            return
        metadata = delivery.result()
        if metadata is not None:
            # The batch's metadata carries its first record's offset.
            last = metadata.offset + count - 1
            self._state.note_written(metadata.topic, metadata.partition, last)

    def _fail(self, task: StreamTask, error: BaseException) -> None:
        if task in self._reported:
            return
        self._reported.add(task)
        if task.state is TaskState.HALTED:
            logger.warning(
                "a send of a task whose membership was lost failed; its inputs were not "
                "committed and go to the keys' next owner",
                extra={"task": str(task.id), "error": repr(error)},
            )
            return
        logger.error(
            "a send failed; nothing processed since the last commit is committed, and the "
            "instance stops",
            exc_info=error,
            extra={"task": str(task.id), "error": repr(error)},
        )
        if self.failure is None:
            self.failure = SendFailed(f"task {task.id}: a send to Kafka failed: {error!r}")
            self._on_failure()

    def _withheld(self, task: StreamTask, count: int) -> None:
        logger.warning(
            "outputs withheld: the membership was lost while the task was processing; the "
            "keys' next owner processes its inputs again",
            extra={"task": str(task.id), "records": count},
        )
