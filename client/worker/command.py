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
import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from client.kafka_security import KafkaSecurity

ENV_PREFIX = "KEYRANGE_WORKER_"

log = logging.getLogger("keyrange.worker")


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"true", "1", "yes", "on"}:
        return True
    if lowered in {"false", "0", "no", "off"}:
        return False
    raise ValueError("expected true or false")


def _topics(value: str) -> list[str]:
    topics = [topic.strip() for topic in value.split(",") if topic.strip()]
    if not topics:
        raise ValueError("expected comma-separated topic names")
    return topics


@dataclass(frozen=True)
class Option:
    flag: str
    field: str
    parse: Callable[[str], Any]
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag.upper().replace("-", "_")


OPTIONS = (
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
    # The coordinator's KEYRANGE_KAFKA_* settings under the worker's prefix (the chart sets
    # both from the same values); docs/kafka-security.md.
    Option(
        "kafka-security-protocol",
        "kafka_security_protocol",
        str,
        "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    ),
    Option("kafka-ssl-cafile", "kafka_ssl_cafile", str, "CA bundle to verify the brokers"),
    Option("kafka-ssl-certfile", "kafka_ssl_certfile", str, "client certificate (mutual TLS)"),
    Option("kafka-ssl-keyfile", "kafka_ssl_keyfile", str, "the client certificate's key"),
    Option("kafka-ssl-key-password", "kafka_ssl_key_password", str, "the key's password"),
    Option("kafka-ssl-check-hostname", "kafka_ssl_check_hostname", _boolean, "true (default)"),
    Option(
        "kafka-sasl-mechanism",
        "kafka_sasl_mechanism",
        str,
        "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER",
    ),
    Option("kafka-sasl-username", "kafka_sasl_username", str, "SASL user"),
    Option(
        "kafka-sasl-password", "kafka_sasl_password", str, "SASL password (prefer the variable)"
    ),
    Option(
        "kafka-sasl-oauth-token-file",
        "kafka_sasl_oauth_token_file",
        str,
        "OAUTHBEARER token file, read at every connection",
    ),
)
_REQUIRED = ("topics", "group_id", "bootstrap_servers", "coordinator_url")


class UsageError(Exception):
    """Bad options or target: one line for the user, exit code 2."""


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
    for option in OPTIONS:
        parser.add_argument(f"--{option.flag}", default=None, help=f"{option.help} ({option.env})")
    parser.add_argument(
        "--log-level", default=None, help=f"log level, default INFO ({ENV_PREFIX}LOG_LEVEL)"
    )
    parser.add_argument(
        "--log-format",
        default=None,
        help="auto (text on a terminal, JSON elsewhere; the default), text or json "
        f"({ENV_PREFIX}LOG_FORMAT)",
    )
    return parser


def settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``WorkerConfig`` fields set by a flag or a variable; UsageError for bad values."""
    chosen: dict[str, Any] = {}
    for option in OPTIONS:
        raw = getattr(args, option.flag.replace("-", "_"))
        source = f"--{option.flag}"
        if raw is None:
            raw = environ.get(option.env)
            source = option.env
        if raw is None:
            continue
        try:
            chosen[option.field] = option.parse(raw)
        except ValueError:
            raise UsageError(f"{source}: invalid value {raw!r}") from None
    security = {
        name.removeprefix("kafka_").replace("security_protocol", "protocol"): chosen.pop(name)
        for name in [name for name in chosen if name.startswith("kafka_")]
    }
    if security:
        chosen["kafka_security"] = KafkaSecurity(**security)
    missing = [name for name in _REQUIRED if name not in chosen]
    if missing:
        flags = {option.field: option for option in OPTIONS}
        names = ", ".join(f"--{flags[name].flag} ({flags[name].env})" for name in missing)
        raise UsageError(f"missing {names}")
    return chosen


def load_target(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"target {spec!r} must be module:Name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import {module_name}: {error}") from None
    target = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{module_name} has no {attribute}") from None
    return target


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    from aiokafka.errors import KafkaError

    from client.errors import KeyrangeClientError
    from client.worker.config import WorkerConfig
    from client.worker.failures import WorkerFailed
    from client.worker.metrics import MetricsUnavailable
    from client.worker.runtime import Worker
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
    except (UsageError, ValueError) as error:
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
    level = args.log_level or environ.get(f"{ENV_PREFIX}LOG_LEVEL") or "INFO"
    fmt = args.log_format or environ.get(f"{ENV_PREFIX}LOG_FORMAT") or "auto"
    return level.upper(), fmt
