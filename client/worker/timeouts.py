"""Processing timeouts: every call of ``process`` gets ``processing_timeout_s`` to be
acknowledged. A call that timed out is stopped where it can be (``Attempt.stop``), and its
outcome, the timeout, waits for the call to end, so no retry (and no next record of its key)
overlaps it (the runtime resolves it when the call ends). A task's call that returned before
it acknowledged ends with the acknowledgement: nothing can stop the work still pending."""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from client.worker.failures import ProcessingTimeout
from client.worker.lanes import Observer, Resolve

logger = logging.getLogger(__name__)


class Timeouts:
    """The deadlines of the attempts' calls, and what one passing does."""

    def __init__(self, timeout_s: float, loop: asyncio.AbstractEventLoop, resolve: Resolve) -> None:
        self._timeout = timeout_s
        self._loop = loop
        self._resolve = resolve
        # (deadline, the attempt's observer), in deadline order.
        self._deadlines: deque[tuple[float, Observer]] = deque()

    def start(self, observer: Observer) -> None:
        """The call ``observer`` acknowledges is about to start."""
        self._deadlines.append((self._loop.time() + self._timeout, observer))

    async def expire_periodically(self) -> None:
        """Processing timeouts without a timer per record: every attempt has the same
        timeout, so deadlines come in the order attempts started. An entry outlives its
        attempt's outcome until its deadline, holding only the detached observer."""
        deadlines = self._deadlines
        while True:
            now = self._loop.time()
            while deadlines and deadlines[0][0] <= now:
                _, observer = deadlines.popleft()
                if not observer.resolved:
                    self._timed_out(observer)
            await asyncio.sleep(deadlines[0][0] - now if deadlines else self._timeout)

    def _timed_out(self, observer: Observer) -> None:
        error = ProcessingTimeout(f"no acknowledgement within {self._timeout} s")
        attempt = observer.attempt
        if attempt is None or not attempt.calling or attempt.observer is not observer:
            self._resolve(observer, error)
            return
        # Its call is still under way: stopped where it can be; the outcome waits for it to
        # end, so no retry (and no next record of the key) overlaps it.
        attempt.overdue = error
        if attempt.stop is not None:
            attempt.stop()
        tp, record, hashed = attempt.item
        logger.warning(
            "processing timeout; the record's outcome waits for its call to end",
            extra={
                "topic": tp.topic,
                "partition": tp.partition,
                "offset": record.offset,
                "key_hash": hashed,
                "timeout_s": self._timeout,
            },
        )
