"""``StreamsConfig``: every setting of a streams application, checked once."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.kafka_security import KafkaSecurity

MIB = 1024 * 1024


@dataclass(frozen=True)
class StreamsConfig:
    """``application_id`` names the consumer group and prefixes the changelog topics, as in
    Kafka Streams. ``max_task_idle_ms`` is how long a task waits for an empty input before it
    processes the others (Kafka's ``max.task.idle.ms``). ``max_buffered_bytes`` bounds the
    records fetched and not processed yet, each owned partition a share of it, over which
    the partition's fetching pauses (Kafka's ``input.buffer.max.bytes``, KIP-770).
    ``max_buffered_records`` is deprecated, as Kafka Streams deprecated
    ``buffered.records.per.partition``: when set it still pauses a partition holding that
    many records, beside the bytes.
    ``changelog_replication_factor`` is the changelog topics' replication when this
    application creates them. ``processing_threads`` above 1 runs each task's round on a
    thread pool of that size (for processors that block on I/O); 1 runs them on the event
    loop. ``kafka_security`` (TLS, SASL) applies to every Kafka connection the application
    opens: the consumer, the producer, the restorer and the admin client that creates the
    changelogs, since a secured cluster refuses any one of them that comes in plaintext.
    ``cache_max_bytes`` is the record cache's budget for the whole process (Kafka Streams'
    ``statestore.cache.max.bytes``, 10 MiB by default as there; 0 turns it off): stores keep
    their changed entries, the last per key (per key and window in a window store), until
    the next commit, so the changelog carries one record per key per commit and DSL tables
    and aggregations forward one change per key per commit (docs/streams.md, "The record
    cache").
    ``metrics_port`` serves ``app.metrics()`` to Prometheus (the ``streams`` extra) on
    ``metrics_host`` (default ``127.0.0.1``, as the query port: the port has no
    authentication; ``0.0.0.0`` for a scraper on another host).
    ``query_port`` serves the stores over HTTP on ``query_host`` (0: any free port; None, the
    default: no server), and the group learns the address as ``query_advertised_url``, by
    default ``http://`` this host's name (or ``query_host`` when it names one) and the port
    (Kafka Streams' ``application.server``; docs/streams.md, "Queries over HTTP").
    ``num_standby_replicas`` is how many other instances keep a warm copy of each key range
    this one owns, by tailing its changelog (Kafka Streams' ``num.standby.replicas``; 0, the
    default: none; docs/streams.md, "Standby key ranges")."""

    application_id: str
    bootstrap_servers: str
    coordinator_url: str
    token: str | None = None
    state_dir: Path = Path(".keyrange-streams")
    commit_interval_ms: int = 1_000
    max_task_idle_ms: int = 0
    max_buffered_bytes: int = 256 * MIB
    max_buffered_records: int | None = None
    cache_max_bytes: int = 10 * MIB
    processing_threads: int = 1
    session_timeout_ms: int = 10_000
    revoke_timeout_s: float = 30.0
    instance_id: str | None = None
    changelog_replication_factor: int = 1
    show_progress: bool | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    query_port: int | None = None
    query_host: str = "127.0.0.1"
    query_advertised_url: str | None = None
    num_standby_replicas: int = 0
    consumer_options: dict[str, Any] = field(default_factory=dict)
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)

    def __post_init__(self) -> None:
        if not self.application_id or not all(
            char.isalnum() or char in "._-" for char in self.application_id
        ):
            raise ValueError("application_id uses letters, digits, '.', '_' and '-' only")
        for name in (
            "commit_interval_ms",
            "max_buffered_bytes",
            "session_timeout_ms",
            "processing_threads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_buffered_records is not None:
            if self.max_buffered_records < 1:
                raise ValueError("max_buffered_records must be at least 1")
            warnings.warn(
                "max_buffered_records is deprecated: bound the buffer with max_buffered_bytes "
                "(docs/streams.md); until it is removed it still pauses a partition at that "
                "many buffered records",
                FutureWarning,
                stacklevel=3,
            )
        if self.cache_max_bytes < 0:
            raise ValueError("cache_max_bytes must not be negative (0 turns the cache off)")
        if self.num_standby_replicas < 0:
            raise ValueError("num_standby_replicas must not be negative")
        if self.max_task_idle_ms < 0:
            raise ValueError("max_task_idle_ms must not be negative")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError("metrics_port must be in 0..65535")
        if self.query_port is not None and not 0 <= self.query_port <= 65535:
            raise ValueError("query_port must be in 0..65535")
        if self.query_advertised_url is not None and not self.query_advertised_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError("query_advertised_url is an http:// or https:// address")
        if self.changelog_replication_factor < 1:
            raise ValueError("changelog_replication_factor must be at least 1")
        problems = self.kafka_security.problems()
        if problems:
            raise ValueError("; ".join(problems))
