"""The `keyrange` command: run the coordinator, migrate its database, administer groups
through the admin API, and run a worker or a streams application.

`serve` and `migrate` need the coordinator's packages (the `keyrange[server]` extra) and import
them when they run; `admin`, `worker`, `streams` and `version` need only what a plain `pip install
keyrange` brings, so a worker's image runs and administers without the server installed."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from importlib.util import find_spec
from types import FrameType
from typing import TYPE_CHECKING, Any

import httpx

from client.streams import command as streams_command
from client.worker import command as worker_command
from coordinator import logs

if TYPE_CHECKING:
    from coordinator.settings import Settings

log = logging.getLogger("keyrange")

VERSION = "0.1.0"

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

    from coordinator import migrate
    from coordinator.app import create_app
    from coordinator.embedded import EmbeddedBroker, EmbeddedPostgres
    from coordinator.serving import server_config
    from coordinator.settings import load_settings

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    if args.no_migrate:
        overrides["migrate_on_start"] = False
    settings = load_settings(**overrides)
    logs.configure(settings.log_level, settings.log_format)
    try:
        settings.check_bind_address()
    except ValueError as exc:
        print(f"keyrange: {exc}", file=sys.stderr)
        return 2
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
        print(
            f"Keyrange coordinator on http://{settings.host}:{settings.port} "
            f"(API docs: http://{settings.host}:{settings.port}/docs; "
            f"Kafka: {settings.kafka_bootstrap})",
            file=sys.stderr,
            flush=True,
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


def _version(_: argparse.Namespace) -> int:
    print(VERSION)
    return 0


class AdminApi:
    """A thin caller of the admin routes that prints replies as JSON and problems as one line
    naming the coordinator it asked, so a wrong ``--url`` or ``KEYRANGE_URL`` shows at once."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def call(
        self,
        method: str,
        path: str,
        *,
        notice: Callable[[Any], list[str]] | None = None,
        **kwargs: Any,
    ) -> int:
        """``notice`` picks lines from a success reply worth a warning on stderr."""
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            print(f"keyrange: cannot reach the coordinator at {self.url}: {exc}", file=sys.stderr)
            return 1
        if response.is_success:
            body = response.json()
            print(json.dumps(body, indent=2))
            for line in notice(body) if notice is not None else ():
                print(f"keyrange: warning: {line}", file=sys.stderr)
            return 0
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "error" in body:
            message = f"{body['error']}: {_problem_detail(body)}"
        else:
            message = f"HTTP {response.status_code}"
        print(f"keyrange: {self.url} answered {message}", file=sys.stderr)
        return 1


# Where in the request a validation error sits: the CLI user typed an argument, not a path.
_REQUEST_PARTS = {"path", "query", "body", "header"}


def _problem_detail(body: dict[str, Any]) -> str:
    """The problem's detail, with a validation error's field named as the argument it came
    from (``group_id``, not ``path.group_id``)."""
    errors = body.get("errors")
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        parts = str(errors[0].get("loc", "")).split(".")
        field = ".".join(parts[1:] if parts[0] in _REQUEST_PARTS else parts)
        message = str(errors[0].get("msg", ""))
        return f"{field}: {message}" if field else message
    return str(body.get("detail"))


def _outside_log(body: Any) -> list[str]:
    """The partitions whose stored offsets are past the log end, each as one line."""
    partitions = body.get("partitions", []) if isinstance(body, dict) else []
    return [
        f"{entry['topic']}[{entry['partition']}]: stored offset {entry['stable_offset']} is "
        f"past the log end {entry['high_watermark']}; consumers apply auto_offset_reset, or "
        f"reset it with: keyrange admin reset {body.get('group_id')} --topic {entry['topic']} "
        f"--partitions {entry['partition']} --to-offset 0"
        for entry in partitions
        if entry.get("offset_out_of_range")
    ]


def _partitions(value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("partitions are comma-separated integers") from None


def _boolean(value: str) -> bool:
    lowered = value.lower()
    if lowered in {"true", "on", "yes", "1"}:
        return True
    if lowered in {"false", "off", "no", "0"}:
        return False
    raise argparse.ArgumentTypeError("expected true or false")


def _worker(args: argparse.Namespace) -> int:
    level, fmt = worker_command.logging_settings(args, os.environ)
    if not isinstance(logging.getLevelName(level), int) or fmt not in {"text", "json"}:
        print(f"keyrange worker: invalid log level {level!r} or format {fmt!r}", file=sys.stderr)
        return 2
    logs.configure(level, fmt)
    return worker_command.run(args)


def _streams(args: argparse.Namespace) -> int:
    level, fmt = streams_command.logging_settings(args, os.environ)
    if not isinstance(logging.getLevelName(level), int) or fmt not in {"text", "json"}:
        print(f"keyrange streams: invalid log level {level!r} or format {fmt!r}", file=sys.stderr)
        return 2
    logs.configure(level, fmt)
    return streams_command.run(args)


def _admin(args: argparse.Namespace) -> int:
    api = AdminApi(args.url, args.token)
    commands: dict[str, Callable[[], int]] = {
        "groups": lambda: api.call("GET", "/v1/admin/groups"),
        "describe": lambda: api.call("GET", f"/v1/admin/groups/{args.group}", notice=_outside_log),
        "offsets": lambda: api.call(
            "GET", f"/v1/admin/groups/{args.group}/offsets", notice=_outside_log
        ),
        "reset": lambda: api.call(
            "POST",
            f"/v1/admin/groups/{args.group}/offsets/reset",
            json={
                "topic": args.topic,
                "partitions": args.partitions,
                "to_offset": args.to_offset,
                "force": args.force,
            },
        ),
        "delete-offsets": lambda: api.call(
            "DELETE",
            f"/v1/admin/groups/{args.group}/offsets",
            params={"topic": args.topic} if args.topic else None,
        ),
        "delete-group": lambda: api.call("DELETE", f"/v1/admin/groups/{args.group}"),
        "rebalance": lambda: api.call("POST", f"/v1/admin/groups/{args.group}/rebalance"),
        "remove-member": lambda: api.call(
            "DELETE", f"/v1/admin/groups/{args.group}/members/{args.member}"
        ),
        "topic-config": lambda: (
            api.call("GET", f"/v1/admin/topics/{args.topic}/config")
            if args.accept_range_fetch is None
            else api.call(
                "PUT",
                f"/v1/admin/topics/{args.topic}/config",
                json={"accept_range_fetch": args.accept_range_fetch},
            )
        ),
        "config": lambda: (
            api.call("GET", "/v1/admin/config")
            if args.accept_individual_commit is None and args.default_accept_range_fetch is None
            else api.call(
                "PUT",
                "/v1/admin/config",
                json={
                    "accept_individual_commit": args.accept_individual_commit,
                    "default_accept_range_fetch": args.default_accept_range_fetch,
                },
            )
        ),
    }
    return commands[args.admin_command]()


def _add_connection_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """``--url`` and ``--token``; only the ``admin`` level sets defaults, so a value given
    after the subcommand is not overwritten by one the subcommand never saw."""
    parser.add_argument(
        "--url",
        default=os.environ.get("KEYRANGE_URL", "http://127.0.0.1:8080")
        if defaults
        else argparse.SUPPRESS,
        help="coordinator URL (KEYRANGE_URL)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("KEYRANGE_TOKEN") if defaults else argparse.SUPPRESS,
        help="admin bearer token (KEYRANGE_TOKEN; prefer the variable: arguments show in ps)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyrange",
        description="Keyrange coordinator: cooperative key-range consumption for Kafka. "
        "Settings come from KEYRANGE_* environment variables (see the README).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

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

    version = commands.add_parser("version", help="print the version")
    version.set_defaults(handler=_version)

    admin = commands.add_parser("admin", help="administer groups and offsets over the admin API")
    _add_connection_options(admin, defaults=True)
    # Accepted after the subcommand too (``keyrange admin groups --url ...``), as users type it.
    connection = argparse.ArgumentParser(add_help=False)
    _add_connection_options(connection, defaults=False)
    admin_commands = admin.add_subparsers(dest="admin_command", required=True)

    def admin_command(name: str, text: str) -> argparse.ArgumentParser:
        return admin_commands.add_parser(name, help=text, parents=[connection])

    admin_command("groups", "list groups")
    for name, text in (
        ("describe", "describe a group: members, assignment, offsets, lag"),
        ("offsets", "show a group's offsets with lag"),
        ("delete-group", "delete an empty group and its offsets"),
        ("rebalance", "recompute a group's target assignment now"),
    ):
        admin_command(name, text).add_argument("group")
    reset = admin_command(
        "reset", "reset offsets (to an offset, or drop IC ranges) of an empty group"
    )
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    reset.add_argument("--partitions", type=_partitions, help="e.g. 0,1,2 (default: all)")
    reset.add_argument("--to-offset", type=int, help="new stable offset; omit to drop IC ranges")
    reset.add_argument(
        "--force",
        action="store_true",
        help="reset even past the log end or on a partition the topic does not have",
    )
    delete_offsets = admin_command("delete-offsets", "delete a group's offsets")
    delete_offsets.add_argument("group")
    delete_offsets.add_argument("--topic", help="only this topic")
    remove = admin_command("remove-member", "remove a member from a group")
    remove.add_argument("group")
    remove.add_argument("member")
    topic_config = admin_command("topic-config", "show or set a topic's accept.range.fetch")
    topic_config.add_argument("topic")
    topic_config.add_argument("--accept-range-fetch", type=_boolean)
    config = admin_command("config", "show or set coordinator-wide switches")
    config.add_argument("--accept-individual-commit", type=_boolean)
    config.add_argument("--default-accept-range-fetch", type=_boolean)
    admin.set_defaults(handler=_admin)

    worker_command.add_parser(commands).set_defaults(handler=_worker)
    streams_command.add_parser(commands).set_defaults(handler=_streams)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
