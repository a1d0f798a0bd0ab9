"""What tasks produced, on its way to Kafka: handed to the producer through the ownership gate,
and followed until acknowledged, so the commit protocol marks an input only after everything
it produced is in Kafka.

A failed delivery (a sink record or a changelog write) is fatal to the instance, as under
Kafka Streams' at-least-once: it is logged at ERROR naming the task, nothing processed since
the last commit is marked from then on (the runtime stops; whoever takes the keys processes
those records again), and the failure is kept, so no later flush can pass over it: before,
a flush that met one failure forgot the other sends, and the next commit marked inputs whose
outputs never reached Kafka. A failed send of a task already halted by a lost membership is
only a warning: its inputs are never committed by this instance anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from client.streams.errors import SendFailed
from client.streams.gate import TaskGate
from client.streams.ports import Producer
from client.streams.state import StateManager
from client.streams.task import StreamTask, TaskState

logger = logging.getLogger(__name__)


class Outputs:
    """The producer side of the runtime: ``send`` hands tasks' outputs over, ``flush`` waits
    for them and raises ``SendFailed`` once any delivery failed."""

    def __init__(
        self,
        producer: Producer,
        state: StateManager,
        gate: TaskGate,
        on_failure: Callable[[], None],
    ) -> None:
        self._producer = producer
        self._state = state
        self._gate = gate
        self._on_failure = on_failure
        # Handed over and not yet looked at, oldest first: deliveries complete about in
        # order, so each ``send`` looks at the done ones at the head (no callback per record).
        self._sends: deque[tuple[StreamTask, asyncio.Future[Any]]] = deque()
        self._reported: set[StreamTask] = set()
        self.failure: SendFailed | None = None

    async def send(self, tasks: Iterable[StreamTask]) -> None:
        """Hand the tasks' outputs over; ``SendFailed`` once a delivery failed, so a failure
        stops the instance within a round of being known, not at the next commit."""
        self._look_at_done()
        if self.failure is not None:
            raise self.failure
        for task in tasks:
            if not task.outgoing:
                continue
            outgoing, task.outgoing = task.outgoing, []
            for index, record in enumerate(outgoing):
                # Asked per record: handing one over may wait for the producer's buffer,
                # and the session deadline may pass meanwhile.
                if not self._gate.may_send(task):
                    self._withheld(task, len(outgoing) - index)
                    break
                try:
                    delivery = await self._producer.send(
                        record.topic,
                        value=record.value,
                        key=record.key,
                        partition=record.partition,
                        headers=list(record.headers) or None,
                    )
                except Exception as error:
                    # Refused before it was queued (too large, the producer closed): the
                    # same failure as a delivery that failed later.
                    self._fail(task, error)
                    raise self.failure or error from error
                if record.changelog_of is not None:
                    delivery.add_done_callback(self._note_written)
                self._sends.append((task, delivery))

    async def flush(self) -> None:
        """Until everything handed over is acknowledged; ``SendFailed`` if anything handed
        over since the instance started failed (this flush's sends or earlier ones)."""
        if self.failure is None:
            await self._producer.flush()
            self._look_at_done()
        if self.failure is not None:
            raise self.failure

    def _look_at_done(self) -> None:
        sends = self._sends
        while sends and sends[0][1].done():
            task, delivery = sends.popleft()
            error = asyncio.CancelledError() if delivery.cancelled() else delivery.exception()
            if error is not None:
                self._fail(task, error)

    def _note_written(self, delivery: asyncio.Future[Any]) -> None:
        if not delivery.cancelled() and delivery.exception() is None:
            metadata = delivery.result()
            self._state.note_written(metadata.topic, metadata.partition, metadata.offset)

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
