"""The coordinator's subcommands of the `keyrange` command: run the coordinator, migrate its
database, administer groups through the admin API. The command's root is `client/cli.py`, which
adds these to its own (the runtimes, topics, the version); this package imports no client
runtime. `python -m coordinator` runs these subcommands alone.

`serve` and `migrate` need the coordinator's packages (the `keyrange[server]` extra) and import
them when they run; `admin` needs only what a plain `pip install keyrange` brings, so a worker's
image administers without the server installed."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from importlib.util import find_spec
from types import FrameType
from typing import TYPE_CHECKING, Any

from coordinator import logs
from coordinator.admin_cli import commands as admin_commands

if TYPE_CHECKING:
    from coordinator.settings import Settings

log = logging.getLogger("keyrange")

# The embedded broker listens on loopback only (coordinator/embedded/broker.py).
_BROKER_HOST = "127.0.0.1"

# Import names of the packages the `server` extra installs (pyproject.toml).
SERVER_PACKAGES = (
    "fastapi",
    "uvicorn",
    "sqlalchemy",
    "asyncpg",
    "alembic",
    "pydantic",
    "pydantic_settings",
    "prometheus_client",
    "re2",
    "jinja2",
    "swagger_ui_bundle",
)


def missing_server_packages() -> list[str]:
    return [name for name in SERVER_PACKAGES if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return find_spec(name) is not None
    except ImportError:  # present but unusable counts as missing
        return False


Command = Callable[[argparse.Namespace], int]


def _needs_server(command: Command) -> Command:
    """Refuse with one clear line, not an ImportError, where the server extra is missing."""

    def checked(args: argparse.Namespace) -> int:
        missing = missing_server_packages()
        if missing:
            print(
                f"keyrange: this command runs the coordinator, which needs its packages: "
                f"pip install 'keyrange[server]' (missing: {', '.join(missing)})",
                file=sys.stderr,
            )
            return 2
        return command(args)

    return checked


class _Terminated(Exception):
    """SIGTERM, raised where ``serve`` is, so the embedded services it started are stopped on
    the way out, as Ctrl-C's KeyboardInterrupt does."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def _serve(args: argparse.Namespace) -> int:
    from coordinator.embedded import EmbeddedServiceError
    from coordinator.settings import InvalidSettings

    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again with the handler
    # found before it started. Left at the default, that killed the process there, before the
    # embedded Postgres and broker were stopped: `kill`, systemd, Docker and Kubernetes all
    # stop a process this way.
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _serve_with_services(args)
    except _Terminated:
        if logging.getLogger().handlers:
            # In the logs' format: a container's collector reads JSON to the last line.
            log.info("stopped on SIGTERM")
        else:  # stopped before the logs were set up
            print("keyrange: stopped on SIGTERM", file=sys.stderr)
        return 0
    except InvalidSettings as exc:
        print(f"keyrange: invalid settings: {exc}", file=sys.stderr)
        return 2
    except EmbeddedServiceError as exc:
        print(f"keyrange: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve_with_services(args: argparse.Namespace) -> int:
    import uvicorn

    from client.tracing import TracingUnavailable, configure_from_environment
    from coordinator import migrate
    from coordinator.app import create_app
    from coordinator.embedded import EmbeddedBroker, EmbeddedPostgres
    from coordinator.serving import raise_open_file_limit, server_config
    from coordinator.settings import load_settings

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    if args.no_migrate:
        overrides["migrate_on_start"] = False
    settings = load_settings(**overrides)
    output = logs.configure(settings.log_level, settings.log_format)
    try:
        settings.check_bind_address()
        configure_from_environment()
    except (ValueError, TracingUnavailable) as exc:
        print(f"keyrange: {exc}", file=sys.stderr)
        return 2
    raise_open_file_limit(settings)
    busy = _busy_ports(settings)
    for problem in busy:
        print(f"keyrange: {problem}", file=sys.stderr)
    if busy:
        print("keyrange: nothing was started", file=sys.stderr)
        return 1
    with ExitStack() as services:
        if settings.database_url is None:
            postgres = services.enter_context(
                EmbeddedPostgres(os.path.join(settings.data_dir, "postgres"))
            )
            database_url = postgres.start()
            log.info("using the embedded Postgres", extra={"data_dir": settings.data_dir})
        else:
            database_url = settings.database_url.get_secret_value()
        if settings.kafka_bootstrap is None:
            broker = services.enter_context(
                EmbeddedBroker(
                    os.path.join(settings.data_dir, "broker"), port=settings.embedded_broker_port
                )
            )
            settings = settings.model_copy(update={"kafka_bootstrap": broker.start()})
            log.info("using the embedded broker", extra={"bootstrap": settings.kafka_bootstrap})
        if settings.migrate_on_start:
            migrate.upgrade(database_url)
        app = create_app(settings, database_url)
        base = f"http://{settings.host}:{settings.port}"
        output.announce(
            "Keyrange coordinator starting",
            {
                "url": base,
                "console": f"{base}/ui",
                "docs": f"{base}/docs",
                "kafka": str(settings.kafka_bootstrap),
            },
        )
        uvicorn.Server(server_config(app, settings)).run()
    return 0


def _busy_ports(settings: Settings) -> list[str]:
    """Every port ``serve`` would listen on that is taken, each with what to do about it."""
    from coordinator.ports import port_problem

    problems = []
    coordinator = port_problem(settings.host, settings.port)
    if coordinator is not None:
        problems.append(
            f"{coordinator}, where the coordinator would listen: stop what holds it, or choose "
            "another port with --port or KEYRANGE_PORT"
        )
    if settings.kafka_bootstrap is None:
        port = settings.embedded_broker_port
        broker = port_problem(_BROKER_HOST, port)
        if broker is None and port == settings.port and settings.host in (_BROKER_HOST, "0.0.0.0"):
            broker = f"port {port} is the coordinator's port too"
        if broker is not None:
            problems.append(
                f"{broker}, where the embedded broker would listen: if a Kafka broker runs "
                f"there, use it with KEYRANGE_KAFKA_BOOTSTRAP={_BROKER_HOST}:{port}; otherwise "
                "choose another port with KEYRANGE_EMBEDDED_BROKER_PORT"
            )
    return problems


def _migrate(args: argparse.Namespace) -> int:
    from coordinator import migrate
    from coordinator.settings import InvalidSettings, load_settings

    try:
        settings = load_settings()
    except InvalidSettings as exc:
        print(f"keyrange: invalid settings: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    if settings.database_url is None:
        print("keyrange: KEYRANGE_DATABASE_URL is not set", file=sys.stderr)
        return 2
    url = settings.database_url.get_secret_value()
    if args.wait_for_db:
        asyncio.run(migrate.wait_for_database(url, args.wait_for_db))
    migrate.upgrade(url, args.revision)
    print(f"database migrated to {args.revision}", file=sys.stderr)
    return 0


def add_commands(commands: Any) -> None:
    """Add ``serve``, ``migrate`` and ``admin`` to ``commands`` (an argparse subparsers
    action)."""
    serve = commands.add_parser(
        "serve", help="run the coordinator (embedded Postgres and broker when not configured)"
    )
    serve.add_argument("--host", help="listen address (KEYRANGE_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (KEYRANGE_PORT, default 8080)")
    serve.add_argument("--no-migrate", action="store_true", help="do not apply migrations on start")
    serve.set_defaults(handler=_needs_server(_serve))

    migrate_cmd = commands.add_parser("migrate", help="apply database migrations and exit")
    migrate_cmd.add_argument("--revision", default="head", help="target revision (default head)")
    migrate_cmd.add_argument(
        "--wait-for-db",
        type=float,
        default=0,
        metavar="SECONDS",
        help="wait up to SECONDS for the database to accept connections first",
    )
    migrate_cmd.set_defaults(handler=_needs_server(_migrate))

    admin_commands.add_parser(commands).set_defaults(handler=admin_commands.run)


def main(argv: Sequence[str] | None = None) -> int:
    """The coordinator's subcommands alone (``python -m coordinator serve``)."""
    parser = argparse.ArgumentParser(prog="keyrange", description="Keyrange coordinator.")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
