"""A failed call's next step under the failure policy (docs/workers.md): give the record
back, skip it, try it again after a backoff, send it to the dead-letter topic, or stop the
worker with its key held. The ordering state (which keys are open, which lanes run) stays
with the runtime; this part says what happens to the attempt and hands it back there."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from client.runtime.seams import WorkerSource
from client.worker.config import WorkerConfig
from client.worker.deadletter import DeadLetters
from client.worker.failures import Backoff, FailureHistory, Next, WorkerFailed, next_step
from client.worker.lanes import Attempt, Lane
from client.worker.lifecycle import Lifecycle

logger = logging.getLogger(__name__)


class Stats:
    """Running totals for metrics and tests."""

    __slots__ = ("dead_lettered", "failed", "processed", "retried", "skipped")

    def __init__(self) -> None:
        self.processed = 0
        self.failed = 0
        self.retried = 0
        self.dead_lettered = 0
        self.skipped = 0


class Settles(Protocol):
    """Where an attempt's outcome goes: the runtime's ordering state."""

    def settle(self, attempt: Attempt, *, processed: bool) -> None:
        """Its record has its outcome: mark it (or give it back), open its key."""

    def forget(self, attempt: Attempt) -> None:
        """It has no outcome and never will from this member (the worker stops)."""

    def schedule(self, lane: Lane) -> None: ...


class Failures:
    """Applies the policy to failed attempts; owns their retry timers and dead letters."""

    def __init__(
        self,
        config: WorkerConfig,
        source: WorkerSource,
        dead_letters: DeadLetters | None,
        lifecycle: Lifecycle,
        settles: Settles,
        stats: Stats,
    ) -> None:
        self._config = config
        self._source = source
        self._dead_letters = dead_letters
        self._lifecycle = lifecycle
        self._settles = settles
        self._stats = stats
        self._backoff = Backoff(config.retry_backoff_s, config.retry_backoff_max_s)
        self._rng = random.Random()
        self._loop = asyncio.get_running_loop()
        self._background: set[asyncio.Task[Any]] = set()

    def failed(self, attempt: Attempt, error: BaseException) -> None:
        tp, record, _ = attempt.item
        now_ms = int(time.time() * 1000)
        attempt.first_failure_ms = attempt.first_failure_ms or now_ms
        attempt.last_failure_ms = now_ms
        self._stats.failed += 1
        where = {
            "topic": tp.topic,
            "partition": tp.partition,
            "offset": record.offset,
            "attempt": attempt.number,
            "error_type": type(error).__name__,
            "error": str(error),
        }
        step = next_step(
            self._config.failure_policy,
            attempt.number,
            self._config.max_attempts,
            still_ours=not (attempt.withdrawn or self._lifecycle.stopping),
        )
        trace = attempt.trace
        if step is Next.GIVE_BACK:
            if trace is not None:
                trace.failed(error, "given_back", attempt=attempt.number)
            self._settles.settle(attempt, processed=False)
        elif step is Next.SKIP:
            logger.warning("record failed; skipped", extra=where)
            self._stats.skipped += 1
            if trace is not None:
                trace.failed(error, "skipped", attempt=attempt.number)
                trace.end("skipped")
            self._settles.settle(attempt, processed=True)
        elif step is Next.RETRY:
            delay = self._backoff.delay(attempt.number, self._rng)
            logger.warning("record failed; trying again", extra={**where, "delay_s": delay})
            self._stats.retried += 1
            if trace is not None:
                trace.failed(error, "retry", attempt=attempt.number, delay_s=delay)
            attempt.timer = self._loop.call_later(delay, self._retry_due, attempt)
        elif step is Next.DEAD_LETTER:
            attempt.dead_lettering = True
            if trace is not None:
                trace.failed(error, "dead_letter", attempt=attempt.number)
            self._spawn(self._dead_letter(attempt, error))
        else:
            if trace is not None:
                trace.failed(error, "stopped", attempt=attempt.number)
                trace.end("failed")
            logger.error("record failed; stopping (failure policy at_least_once)", extra=where)
            # The key stays open: no later record of it runs, so none is committed past it.
            self._stop(
                attempt,
                WorkerFailed(
                    f"{tp.topic}[{tp.partition}] offset {record.offset} failed: {error!r}"
                ),
            )

    def cancel(self) -> None:
        """The shutdown is over: dead letters still on their way are abandoned (their
        records were given back)."""
        for task in self._background:
            task.cancel()

    def _retry_due(self, attempt: Attempt) -> None:
        attempt.timer = None
        attempt.lane.retries.append(attempt)
        self._settles.schedule(attempt.lane)

    async def _dead_letter(self, attempt: Attempt, error: BaseException) -> None:
        _, record, hashed = attempt.item
        history = FailureHistory(
            attempt.number, error, attempt.first_failure_ms, attempt.last_failure_ms
        )
        if not self._source.may_hand_out():
            return  # the session was lost (which gave the record back): no side effect
        try:
            if self._dead_letters is None:
                raise WorkerFailed("no dead-letter topic is configured")
            await self._dead_letters.send(record, hashed, history)
        except Exception as send_error:
            if attempt.trace is not None:
                attempt.trace.failed(send_error, "dead_letter_failed")
                attempt.trace.end("failed")
            logger.error(
                "dead letter not acknowledged; stopping",
                extra={"offset": record.offset, "error": repr(send_error)},
            )
            self._stop(
                attempt,
                WorkerFailed(f"dead letter of offset {record.offset} failed: {send_error}"),
            )
            return
        self._stats.dead_lettered += 1
        if attempt.trace is not None:
            attempt.trace.end("dead_lettered")
        self._settles.settle(attempt, processed=True)

    def _stop(self, attempt: Attempt, error: WorkerFailed) -> None:
        """Stop the worker on ``attempt``: its record goes back uncommitted and its key
        stays open, so nothing later of the key runs or is committed past it."""
        self._settles.forget(attempt)
        self._source.give_back(attempt.item[1])
        self._lifecycle.fail(error)

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
