"""Waiting for a condition with a deadline, the one way tests wait (never sleep-then-assert):
CI's machine has two busy cores, so a fixed sleep is either too short there or wasted here."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def until(
    condition: Callable[[], object | Awaitable[object]],
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
) -> None:
    """Poll ``condition`` (a plain or an async callable) until it is truthy; AssertionError
    naming ``what`` once ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)
