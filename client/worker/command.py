"""`keyrange worker module:Target ...`: run a task or handler with no code around it. Every
option is also a ``KEYRANGE_WORKER_<OPTION>`` environment variable (a flag wins over the
variable, the variable over the default), so a worker image is configured like any other
container. Needs only what `pip install keyrange` brings (metrics: the `worker` extra).

Exit codes: 0 after a clean shutdown, 1 when the worker stopped on a failure
(``WorkerFailed``: nothing past it was committed) or could not reach Kafka or the
coordinator, 2 for bad options, a target that cannot be loaded, or metrics that cannot be
served.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from client.command_line import (
    KAFKA_SECURITY_OPTIONS,
    Option,
    Options,
    UsageError,
    kafka_security,
    load_target,
)

ENV_PREFIX = "KEYRANGE_WORKER_"

log = logging.getLogger("keyrange.worker")


def _topics(value: str) -> list[str]:
    topics = [topic.strip() for topic in value.split(",") if topic.strip()]
    if not topics:
        raise ValueError("expected comma-separated topic names")
    return topics


_TABLE = (
    Option("topics", "topics", _topics, "comma-separated topics to consume (required)"),
    Option("group", "group_id", str, "consumer group id (required)"),
    Option("bootstrap", "bootstrap_servers", str, "Kafka bootstrap servers (required)"),
    Option("coordinator", "coordinator_url", str, "coordinator URL (required)"),
    Option("token", "token", str, "coordinator bearer token (prefer the variable)"),
    Option("max-concurrency", "max_concurrency", int, "records processed at once"),
    Option("threads", "worker_threads", int, "threads for synchronous code"),
    Option("processes", "processes", int, "processes for a synchronous handler (0: threads)"),
    Option("subpartitions", "subpartitions", int, "tasks per partition"),
    Option("processing-timeout", "processing_timeout_s", float, "seconds to acknowledge"),
    Option("failure-policy", "failure_policy", str, "at_least_once, skip or retry"),
    Option("max-attempts", "max_attempts", int, "attempts before a dead letter (retry)"),
    Option("retry-backoff", "retry_backoff_s", float, "first wait before a retry, seconds"),
    Option("retry-backoff-max", "retry_backoff_max_s", float, "longest wait, seconds"),
    Option("dead-letter-topic", "dead_letter_topic", str, "default <group>.dead-letters"),
    Option("punctuate-interval", "punctuate_interval_s", float, "seconds between punctuate"),
    Option("max-buffered-bytes", "max_buffered_bytes", int, "bound of buffered records"),
    Option("resume-ratio", "resume_ratio", float, "resume below this share of the bound"),
    Option("drain-timeout", "drain_timeout_s", float, "seconds to finish on stop or revoke"),
    Option("session-timeout-ms", "session_timeout_ms", int, "membership session timeout"),
    Option(
        "coordinator-start-timeout-ms",
        "coordinator_start_timeout_ms",
        int,
        "give up when the coordinator does not answer within this long at start",
    ),
    Option("commit-interval-ms", "commit_interval_ms", int, "periodic commit interval"),
    Option("assignor", "assignor", str, "round-robin or another coordinator assignor"),
    Option("metrics-port", "metrics_port", int, "serve Prometheus metrics on this port"),
    Option("metrics-host", "metrics_host", str, "the address the metrics port listens on"),
    *KAFKA_SECURITY_OPTIONS,
)
OPTIONS = Options(
    ENV_PREFIX, _TABLE, required=("topics", "group_id", "bootstrap_servers", "coordinator_url")
)


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The `worker` subcommand on the `keyrange` parser's subparsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "worker",
        help="run a WorkerTask or a handler over a group's records (docs/workers.md)",
        description="Every option is also an environment variable: "
        f"{ENV_PREFIX}<OPTION> (e.g. {ENV_PREFIX}MAX_CONCURRENCY).",
    )
    parser.add_argument(
        "target",
        nargs="?",
        default=None,
        help=f"module:Name of a WorkerTask class or a handler function ({ENV_PREFIX}TARGET)",
    )
    OPTIONS.add_to(parser)
    return parser


def settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``WorkerConfig`` fields set by a flag or a variable; UsageError for bad values."""
    return kafka_security(OPTIONS.settings(args, environ))


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    from aiokafka.errors import KafkaError

    from client.errors import KeyrangeClientError
    from client.metrics_server import MetricsUnavailable
    from client.tracing import TracingUnavailable, configure_from_environment
    from client.worker.app import Worker
    from client.worker.config import WorkerConfig
    from client.worker.failures import WorkerFailed
    from client.worker.task import WorkerTask

    try:
        spec = args.target or environ.get(f"{ENV_PREFIX}TARGET")
        if not spec:
            raise UsageError(f"missing the target module:Name ({ENV_PREFIX}TARGET)")
        # The working directory is where a worker image keeps its code.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        target = load_target(spec)
        is_task = isinstance(target, type) and issubclass(target, WorkerTask)
        if not is_task and (isinstance(target, type) or not callable(target)):
            raise UsageError(f"{spec} is neither a WorkerTask subclass nor a function")
        config = WorkerConfig(**settings(args, environ))
        worker = Worker(config, task=target) if is_task else Worker(config, handler=target)
        configure_from_environment()
    except (UsageError, ValueError, TracingUnavailable) as error:
        print(f"keyrange worker: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(worker.run(handle_signals=True))
    except MetricsUnavailable as error:
        print(f"keyrange worker: {error}", file=sys.stderr)
        return 2
    except WorkerFailed as error:
        log.error("worker stopped on a failure", extra={"error": str(error)})
        return 1
    except (KafkaError, KeyrangeClientError) as error:
        print(f"keyrange worker: {error}", file=sys.stderr)
        return 1
    return 0


def logging_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str]:
    return OPTIONS.logging(args, environ)
