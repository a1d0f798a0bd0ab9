"""The shutdown a container platform expects, shared by the runtimes that drive a
``KeyrangeConsumer`` (``client.worker.Worker``, ``client.streams.StreamsApp``).

A stop asked for by code (``request``) or by the first SIGTERM or SIGINT ends the drive the
same way: the consumer stops, which finishes the runtime (its records in processing, its
commit protocol), commits and leaves the group, so the keys move to another member at once
instead of after a session timeout. A second signal exits at once, by the signal's default
action, for an operator whose graceful stop takes too long.

Before the drive begins (waiting for the coordinator, creating topics, opening stores) there is
nothing to finish or commit, so a stop cancels the start-up and the run returns at once: an
operator's first Ctrl-C, or a platform's SIGTERM, is never left waiting behind a minute of
retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator

from client.consumer import KeyrangeConsumer
from client.consumer_source import ConsumerSource
from client.runtime.seams import Runtime

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    """One runtime's stop request and the drive that ends on it."""

    def __init__(self, runtime: str, group_id: str) -> None:
        self._runtime = runtime
        self._group_id = group_id
        self._requested = asyncio.Event()
        self._signals = 0
        self._starting: asyncio.Task[object] | None = None
        self._stopped_while_starting = False

    def request(self) -> None:
        self._requested.set()
        if self._starting is not None and not self._stopped_while_starting:
            self._stopped_while_starting = True
            self._starting.cancel()

    @contextlib.contextmanager
    def signals_handled(self, enabled: bool) -> Iterator[None]:
        """SIGTERM and SIGINT ask for the stop while inside, when ``enabled``; a stop asked
        for before ``drive`` begins ends the block at once, without an exception."""
        task = asyncio.current_task()
        self._starting = task
        loop = asyncio.get_running_loop()
        if enabled:
            for number in SIGNALS:
                loop.add_signal_handler(number, self._on_signal, number)
        try:
            yield
        except asyncio.CancelledError:
            if not self._stopped_while_starting or task is None:
                raise
            task.uncancel()
            logger.info(f"{self._runtime} stopped before it started")
        finally:
            self._starting = None
            if enabled:
                for number in SIGNALS:
                    loop.remove_signal_handler(number)

    async def drive(
        self,
        consumer: KeyrangeConsumer,
        make_runtime: Callable[[ConsumerSource], Runtime],
        *,
        stopping: str,
    ) -> None:
        """Run ``consumer.drive(make_runtime)`` until it ends by itself (a failure) or a stop
        is requested; then stop the consumer, logging ``stopping``, and wait for the drive."""
        self._starting = None
        logger.info(
            f"{self._runtime} started",
            extra={"group_id": self._group_id, "member_id": consumer.member_id},
        )
        driving = asyncio.create_task(
            consumer.drive(make_runtime), name=f"keyrange-{self._runtime}"
        )
        requested = asyncio.create_task(self._requested.wait())
        try:
            await asyncio.wait({driving, requested}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            requested.cancel()
        if not driving.done():
            logger.info(f"{self._runtime} stopping: {stopping}")
            await consumer.stop()
        try:
            await driving
        finally:
            logger.info(f"{self._runtime} stopped", extra={"group_id": self._group_id})

    def _on_signal(self, number: int) -> None:
        self._signals += 1
        name = signal.Signals(number).name
        if self._signals == 1:
            logger.info("signal received; shutting down", extra={"signal": name})
            self.request()
            return
        logger.warning("second signal; exiting at once", extra={"signal": name})
        signal.signal(number, signal.SIG_DFL)
        signal.raise_signal(number)
