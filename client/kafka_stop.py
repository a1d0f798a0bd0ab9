"""Stopping an ``AIOKafkaConsumer`` so that it really stops.

aiokafka's background fetch routine awaits the fetches it cancels after an assignment change
with ``CancelledError`` suppressed; a ``stop()`` whose cancellation lands in that moment is
swallowed, the routine goes on waiting for an assignment, and ``stop()`` waits for the routine
for ever (aio-libs/aiokafka#983). A member that stops right after a hand-off (release, then
leave) meets it. So the cancellation is repeated until the routine ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

# How long a stop may take before the fetch routine is cancelled again: well above a normal
# stop (a few milliseconds), well below anything a shutdown budget would notice.
_RECANCEL_AFTER_S = 1.0


async def stop_consumer(kafka: Any) -> None:
    stopping = asyncio.ensure_future(kafka.stop())
    while True:
        done, _ = await asyncio.wait({stopping}, timeout=_RECANCEL_AFTER_S)
        if done:
            stopping.result()
            return
        routine = getattr(getattr(kafka, "_fetcher", None), "_fetch_task", None)
        if routine is None or routine.done():
            continue
        logger.warning("the Kafka consumer's fetch routine ignored its stop; cancelling it again")
        routine.cancel()
