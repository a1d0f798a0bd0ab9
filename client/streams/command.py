"""`keyrange streams module:build_topology --application-id ...`: run a topology with no
code around it. ``build_topology`` is called with no arguments and returns a ``Topology``.
Every option is also a ``KEYRANGE_STREAMS_<OPTION>`` environment variable (a flag wins over
the variable). Exit codes as for `keyrange worker`: 0 after a clean shutdown, 1 when Kafka,
the coordinator or the topology failed at run time, 2 for bad options or target (a metrics or
query port that cannot be listened on included).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client.command_line import (
    KAFKA_SECURITY_OPTIONS,
    Option,
    Options,
    UsageError,
    kafka_security,
    load_target,
)

ENV_PREFIX = "KEYRANGE_STREAMS_"

log = logging.getLogger("keyrange.streams")


_TABLE = (
    Option("application-id", "application_id", str, "group id and changelog prefix (required)"),
    Option("bootstrap", "bootstrap_servers", str, "Kafka bootstrap servers (required)"),
    Option("coordinator", "coordinator_url", str, "coordinator URL (required)"),
    Option("token", "token", str, "coordinator bearer token (prefer the variable)"),
    Option("state-dir", "state_dir", Path, "where persistent stores live"),
    Option("commit-interval-ms", "commit_interval_ms", int, "commit protocol interval"),
    Option("max-task-idle-ms", "max_task_idle_ms", int, "wait for an empty input this long"),
    Option("max-buffered-bytes", "max_buffered_bytes", int, "bound of buffered records, bytes"),
    Option(
        "max-buffered-records",
        "max_buffered_records",
        int,
        "deprecated: also pause a partition at this many records",
    ),
    Option(
        "cache-max-bytes",
        "cache_max_bytes",
        int,
        "record cache of the stores, bytes for the process (0: off)",
    ),
    Option("processing-threads", "processing_threads", int, "threads running tasks (1: the loop)"),
    Option("session-timeout-ms", "session_timeout_ms", int, "membership session timeout"),
    Option("instance-id", "instance_id", str, "a stable name for this instance"),
    Option("metrics-port", "metrics_port", int, "serve Prometheus metrics on this port"),
    Option("metrics-host", "metrics_host", str, "the address the metrics port listens on"),
    Option("query-port", "query_port", int, "serve the stores over HTTP on this port"),
    Option("query-host", "query_host", str, "the address the query port listens on"),
    Option(
        "query-advertised-url",
        "query_advertised_url",
        str,
        "the query address other instances and callers reach",
    ),
    Option(
        "changelog-replication-factor",
        "changelog_replication_factor",
        int,
        "replication of the changelog topics this application creates",
    ),
    Option(
        "num-standby-replicas",
        "num_standby_replicas",
        int,
        "other instances keeping a warm copy of each key range",
    ),
    *KAFKA_SECURITY_OPTIONS,
)
OPTIONS = Options(
    ENV_PREFIX, _TABLE, required=("application_id", "bootstrap_servers", "coordinator_url")
)


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The `streams` subcommand on the `keyrange` parser's subparsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "streams",
        help="run a stream-processing topology on key-range tasks (docs/streams.md)",
        description=f"Every option is also an environment variable: {ENV_PREFIX}<OPTION>.",
    )
    parser.add_argument(
        "target",
        nargs="?",
        default=None,
        help=f"module:function returning a Topology ({ENV_PREFIX}TARGET)",
    )
    OPTIONS.add_to(parser)
    return parser


def settings(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``StreamsConfig`` fields set by a flag or a variable; UsageError for bad values."""
    return kafka_security(OPTIONS.settings(args, environ))


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    from aiokafka.errors import KafkaError

    from client.errors import KeyrangeClientError
    from client.metrics_server import MetricsUnavailable
    from client.streams.app import StreamsApp
    from client.streams.config import StreamsConfig
    from client.streams.query_server import QueryServerError
    from client.streams.state_dir import StateDirectoryInUse
    from client.streams.topology import Topology
    from client.tracing import TracingUnavailable, configure_from_environment

    try:
        spec = args.target or environ.get(f"{ENV_PREFIX}TARGET")
        if not spec:
            raise UsageError(f"missing the target module:function ({ENV_PREFIX}TARGET)")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        build = load_target(spec)
        if not callable(build):
            raise UsageError(f"{spec} is not a function returning a Topology")
        topology = build()
        if not isinstance(topology, Topology):
            raise UsageError(f"{spec} returned {type(topology).__name__}, not a Topology")
        app = StreamsApp(topology, StreamsConfig(**settings(args, environ)))
        configure_from_environment()
    except (UsageError, ValueError, TracingUnavailable) as error:
        print(f"keyrange streams: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(app.run(handle_signals=True))
    except (MetricsUnavailable, QueryServerError, StateDirectoryInUse) as error:
        print(f"keyrange streams: {error}", file=sys.stderr)
        return 2
    except (KafkaError, KeyrangeClientError) as error:
        print(f"keyrange streams: {error}", file=sys.stderr)
        return 1
    return 0


def logging_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str]:
    return OPTIONS.logging(args, environ)
