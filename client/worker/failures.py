"""The failure policy's arithmetic, no I/O: when a record is tried again, and what its dead
letter says about where it came from."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

# Header names of a dead letter (docs/workers.md); the record's own headers come first.
ORIGIN_TOPIC = "keyrange.origin.topic"
ORIGIN_PARTITION = "keyrange.origin.partition"
ORIGIN_OFFSET = "keyrange.origin.offset"
ORIGIN_TIMESTAMP = "keyrange.origin.timestamp"
KEY_HASH = "keyrange.key.hash"
ATTEMPTS = "keyrange.attempts"
ERROR_TYPE = "keyrange.error.type"
ERROR_MESSAGE = "keyrange.error.message"
FIRST_FAILURE = "keyrange.failure.first"
LAST_FAILURE = "keyrange.failure.last"

# A message longer than this is cut: a dead letter must stay well under Kafka's record size
# limit whatever the exception carries.
MAX_ERROR_MESSAGE = 4096


class ProcessingTimeout(Exception):
    """Neither ``success`` nor ``failure`` came within ``processing_timeout_s``."""


class WorkerFailed(Exception):
    """The worker stopped on a record it could not process (policy ``at_least_once``, or a
    dead letter the broker did not take). The record and every later record of its key stay
    uncommitted and are delivered again on restart."""


class Next(Enum):
    """What a failed attempt leads to."""

    GIVE_BACK = "give back"  # not this member's to decide any more: the next owner retries
    SKIP = "skip"
    RETRY = "retry"
    DEAD_LETTER = "dead letter"
    STOP = "stop"


def next_step(policy: str, attempts: int, max_attempts: int, *, still_ours: bool) -> Next:
    """The failure policy (docs/workers.md): ``still_ours`` is False once the record's slice
    was revoked or lost, or the worker is shutting down."""
    if not still_ours:
        return Next.GIVE_BACK
    if policy == "skip":
        return Next.SKIP
    if policy == "retry":
        return Next.RETRY if attempts < max_attempts else Next.DEAD_LETTER
    return Next.STOP


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: attempt n (1 = the first retry) waits
    ``min(maximum, initial * 2**(n-1))``, of which a random half is taken off, so retries of
    many records failing together (a downstream outage) spread out instead of arriving in
    waves."""

    initial_s: float
    maximum_s: float

    def delay(self, retry: int, rng: random.Random) -> float:
        base = min(self.maximum_s, self.initial_s * 2.0 ** min(retry - 1, 62))
        return base / 2 + rng.uniform(0.0, base / 2)


@dataclass(frozen=True, slots=True)
class FailureHistory:
    """What a dead letter records of a record's attempts; times are epoch milliseconds."""

    attempts: int
    error: BaseException
    first_failure_ms: int
    last_failure_ms: int


def dead_letter_headers(
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key_hash: int,
    history: FailureHistory,
    own_headers: Sequence[tuple[str, bytes]] = (),
) -> list[tuple[str, bytes]]:
    message = str(history.error)[:MAX_ERROR_MESSAGE]
    error_type = type(history.error)
    ours = {
        ORIGIN_TOPIC: topic,
        ORIGIN_PARTITION: str(partition),
        ORIGIN_OFFSET: str(offset),
        ORIGIN_TIMESTAMP: str(timestamp_ms),
        KEY_HASH: str(key_hash),
        ATTEMPTS: str(history.attempts),
        ERROR_TYPE: f"{error_type.__module__}.{error_type.__qualname__}",
        ERROR_MESSAGE: message,
        FIRST_FAILURE: str(history.first_failure_ms),
        LAST_FAILURE: str(history.last_failure_ms),
    }
    # A record that was dead-lettered before (replayed from a dead-letter topic) keeps only
    # the latest origin, so every header name appears once.
    kept = [(name, value) for name, value in own_headers if name not in ours]
    return kept + [(name, value.encode()) for name, value in ours.items()]
