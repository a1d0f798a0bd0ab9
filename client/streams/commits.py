"""The streams commit protocol (at-least-once), its steps in one place:
0. flush the record caches (``client.streams.cache``: their entries go to the stores, the
changelogs and, for DSL tables, downstream, so they are among what step 2 flushes);
1. flush the stores; 2. flush the producer (sinks and changelogs; a failed send stops the
commit, and the instance: ``client.streams.outputs``); 2a. run what waited for those outputs'
acknowledgement (``after_outputs_acknowledged``: the final marks of windows emitted), then
flush the caches, the stores and the producer again, so a mark never reaches a changelog before the
result it marks and is in Kafka before the inputs are; 3. mark the processed records and
commit input offsets through the coordinator; 4. write the checkpoints of changelog offsets.
docs/streams.md says what a crash between the steps does.

When it runs next: at the commit interval, when a processor asks, and after a commit the
coordinator could not take, again after a backoff (0.1 s doubling to 2 s, never later than
the interval), so a coordinator replica restarting is met within a second or two and an
outage shorter than the session costs no more than a few retries (docs/design.md §5: past the
session deadline the loss drops the tasks instead)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from client.errors import (
    ConsumerStopped,
    FencedMemberEpoch,
    KeyrangeClientError,
    UnknownMemberId,
)
from client.streams.outputs import Outputs
from client.streams.state import StateManager
from client.streams.task import StreamTask, TaskState
from client.streams.tasks import Tasks

logger = logging.getLogger(__name__)

_RETRY_INITIAL_S = 0.1
_RETRY_MAX_S = 2.0


class CommitSchedule:
    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._next_at = time.monotonic() + interval_s
        self._retry_s = _RETRY_INITIAL_S
        self._failed = 0

    def due(self) -> bool:
        return time.monotonic() >= self._next_at

    def succeeded(self) -> None:
        if self._failed:
            logger.info("commit succeeded again", extra={"failed_attempts": self._failed})
        self._failed = 0
        self._retry_s = _RETRY_INITIAL_S
        self._next_at = time.monotonic() + self._interval_s

    def failed(self, error: KeyrangeClientError) -> None:
        """The marks stay; the next attempt comes after the backoff. One WARNING per run of
        failures, the rest at DEBUG (the HTTP client warns of an unreachable coordinator)."""
        self._failed += 1
        logger.log(
            logging.WARNING if self._failed == 1 else logging.DEBUG,
            "commit failed; processing goes on and the commit is tried again",
            extra={"error": error.error, "detail": str(error), "attempt": self._failed},
        )
        self._next_at = time.monotonic() + min(self._retry_s, self._interval_s)
        self._retry_s = min(self._retry_s * 2, _RETRY_MAX_S)


class Commits:
    """The commit protocol over the runtime's tasks; the runtime calls it under its round lock,
    so no record is processed between the steps."""

    def __init__(
        self,
        *,
        tasks: Tasks,
        state: StateManager,
        outputs: Outputs,
        mark_processed: Callable[[Any], None],
        commit_offsets: Callable[[], Awaitable[Any]],
        application_id: str,
        interval_s: float,
    ) -> None:
        self._tasks = tasks
        self._state = state
        self._outputs = outputs
        self._mark_processed = mark_processed
        self._commit_offsets = commit_offsets
        self._application_id = application_id
        self.schedule = CommitSchedule(interval_s)

    def due(self) -> bool:
        """At the interval (or the retry's backoff), or once a processor asked for one."""
        return self.schedule.due() or any(
            task.commit_requested for task in self._tasks if task.state is not TaskState.HALTED
        )

    async def _write_out(self) -> None:
        """Caches, stores and the producer, until Kafka acknowledged what they held."""
        for task in self._tasks.values():
            if task.state is not TaskState.HALTED:
                task.flush_caches()
        self._state.flush()
        await self._outputs.send(self._tasks.values())
        await self._outputs.flush()

    async def flush_and_mark(self, tasks: Iterable[StreamTask] | None = None) -> None:
        """Steps 0 to 3a: caches, stores, producer, what waited for the acknowledgement, then
        the marks of ``tasks`` (every task for None). Every task's caches are flushed, since
        the producer's flush covers every task's outputs. A halted task's records are not
        marked: its keys may be another member's, which processes them again; its cache and
        what waited for its outputs are dropped with it, unwritten."""
        await self._write_out()
        acted = sum(
            task.outputs_acknowledged()
            for task in self._tasks.values()
            if task.state is not TaskState.HALTED
        )
        if acted:
            # What waited for the acknowledgement (final marks) wrote to caches and stores.
            await self._write_out()
        for task in self._tasks.values() if tasks is None else tasks:
            if task.state is TaskState.HALTED:
                continue
            processed, task.processed = task.processed, []
            for record in processed:
                self._mark_processed(record)
            task.commit_requested = False

    async def commit(self) -> None:
        """The whole protocol. A coordinator that cannot take the commit now does not stop
        the instance: the marks stay for the next attempt, made with a backoff, until the
        session deadline passes and the loss drops the tasks (docs/design.md §5)."""
        await self.flush_and_mark()
        try:
            await self._commit_offsets()
        except ConsumerStopped:
            return
        except (UnknownMemberId, FencedMemberEpoch) as error:
            # The membership is lost or being lost: the heartbeat's loss handling drops the
            # tasks and their marks, and the member rejoins.
            self.schedule.failed(error)
            return
        except KeyrangeClientError as error:
            if not error.retriable:
                raise
            self.schedule.failed(error)
            return
        self.schedule.succeeded()
        self.write_checkpoints()

    def write_checkpoints(self) -> None:
        """Step 4, and the shutdown's checkpoint of the keys kept for a restart."""
        self._state.write_checkpoints(self._application_id)
