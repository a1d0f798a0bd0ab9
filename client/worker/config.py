"""The worker's settings, checked once when built: a bad value is one clear ``ValueError``
before anything connects. docs/workers.md maps kafka-workers' and Parallel Consumer's
settings to these; `keyrange worker` sets each from a flag or a ``KEYRANGE_WORKER_*``
variable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from client.kafka_security import KafkaSecurity

FailurePolicy = Literal["at_least_once", "skip", "retry"]
FAILURE_POLICIES: tuple[str, ...] = get_args(FailurePolicy)

MIB = 1024 * 1024


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a ``Worker`` needs besides the code it runs."""

    topics: Sequence[str]
    group_id: str
    bootstrap_servers: str | Sequence[str]
    coordinator_url: str
    token: str | None = None
    # Records processed at once (handlers running, or calls into tasks): Parallel Consumer's
    # ``maxConcurrency``.
    max_concurrency: int = 16
    # Threads for synchronous handlers and task methods; None means ``max_concurrency``.
    worker_threads: int | None = None
    # Processes for a synchronous plain handler (CPU-bound work); 0 runs it on threads.
    processes: int = 0
    subpartitions: int = 1
    processing_timeout_s: float = 300.0
    failure_policy: FailurePolicy = "at_least_once"
    max_attempts: int = 3
    retry_backoff_s: float = 0.5
    retry_backoff_max_s: float = 30.0
    dead_letter_topic: str | None = None
    punctuate_interval_s: float = 1.0
    max_buffered_bytes: int = 256 * MIB
    resume_ratio: float = 0.9
    # How long in-flight records may take to finish on shutdown and on a revocation: with
    # the final commit and the leave, a stop fits Kubernetes' default 30 s grace period.
    drain_timeout_s: float = 20.0
    session_timeout_ms: int = 10_000
    # How long start() waits for the coordinator to answer before the worker gives up.
    coordinator_start_timeout_ms: int = 60_000
    commit_interval_ms: int = 1_000
    assignor: str = "round-robin"
    metrics_port: int | None = None
    # The address the metrics port listens on: this host only, unless told (the port has no
    # authentication; "0.0.0.0" for a scraper on another host).
    metrics_host: str = "127.0.0.1"
    consumer_options: Mapping[str, Any] = field(default_factory=dict)
    # TLS and SASL for the consumer and the dead-letter producer alike (docs/kafka-security.md).
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)

    def __post_init__(self) -> None:
        if not self.topics:
            raise ValueError("at least one topic is required")
        if not self.group_id:
            raise ValueError("a group id is required")
        _at_least(1, max_concurrency=self.max_concurrency, subpartitions=self.subpartitions)
        _at_least(1, max_attempts=self.max_attempts, max_buffered_bytes=self.max_buffered_bytes)
        _at_least(0, processes=self.processes)
        if self.worker_threads is not None:
            _at_least(1, worker_threads=self.worker_threads)
        _positive(
            processing_timeout_s=self.processing_timeout_s,
            punctuate_interval_s=self.punctuate_interval_s,
            session_timeout_ms=self.session_timeout_ms,
            coordinator_start_timeout_ms=self.coordinator_start_timeout_ms,
            commit_interval_ms=self.commit_interval_ms,
        )
        _at_least(0, retry_backoff_s=self.retry_backoff_s, drain_timeout_s=self.drain_timeout_s)
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise ValueError("retry_backoff_max_s must be at least retry_backoff_s")
        if self.failure_policy not in FAILURE_POLICIES:
            raise ValueError(f"failure_policy must be one of {', '.join(FAILURE_POLICIES)}")
        if not 0 < self.resume_ratio <= 1:
            raise ValueError("resume_ratio must be in (0, 1]")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError("metrics_port must be in 0..65535")
        problems = self.kafka_security.problems()
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def threads(self) -> int:
        return self.max_concurrency if self.worker_threads is None else self.worker_threads

    @property
    def dead_letters(self) -> str:
        """Where records that failed ``max_attempts`` times go (policy ``retry``)."""
        return self.dead_letter_topic or f"{self.group_id}.dead-letters"


def _at_least(bound: float, **values: float) -> None:
    for name, value in values.items():
        if value < bound:
            raise ValueError(f"{name} must be at least {bound}")


def _positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be greater than 0")
