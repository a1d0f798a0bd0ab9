"""When the streams engine commits next: at the commit interval, and after a commit the
coordinator could not take, again after a backoff (0.1 s doubling to 2 s, never later than
the interval), so a coordinator replica restarting is met within a second or two and an
outage shorter than the session costs no more than a few retries (DESIGN §5: past the
session deadline the loss drops the tasks instead)."""

from __future__ import annotations

import logging
import time

from client.errors import KeyrangeClientError

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
