"""The `keyrange` command: run a worker or a streams application, make test topics, print the
version, and, through the coordinator's package, run the coordinator, migrate its database and
administer groups (`coordinator/cli.py`).

The client SDK imports nothing of the coordinator (the import contracts hold it): the server's
subcommands are reached by module name when the parser is built. That module needs only what a
plain `pip install keyrange` brings; `serve` and `migrate` import the server's packages when
they run, and say which extra to install where it is missing."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from client import topic_command
from client.streams import command as streams_command
from client.worker import command as worker_command

VERSION = "0.1.0"


def _coordinator(module: str) -> ModuleType:
    """A module of the coordinator's package, which ships in the same distribution."""
    return importlib.import_module(f"coordinator.{module}")


def _version(_: argparse.Namespace) -> int:
    print(VERSION)
    return 0


def _client_command(name: str, command: Any) -> Callable[[argparse.Namespace], int]:
    """``keyrange worker`` and ``keyrange streams``: the client's own commands, with this
    process's logging set up as the command's options say."""

    def run(args: argparse.Namespace) -> int:
        logs = _coordinator("logs")
        level, fmt = command.logging_settings(args, os.environ)
        if not isinstance(logging.getLevelName(level), int) or fmt not in logs.LOG_FORMATS:
            problem = f"invalid log level {level!r} or format {fmt!r}"
            print(f"keyrange {name}: {problem}", file=sys.stderr)
            return 2
        logs.configure(level, fmt)
        code: int = command.run(args)
        return code

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyrange",
        description="Keyrange coordinator: cooperative key-range consumption for Kafka. "
        "Settings come from KEYRANGE_* environment variables (see the README).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _coordinator("cli").add_commands(commands)
    version = commands.add_parser("version", help="print the version")
    version.set_defaults(handler=_version)
    worker_command.add_parser(commands).set_defaults(
        handler=_client_command("worker", worker_command)
    )
    streams_command.add_parser(commands).set_defaults(
        handler=_client_command("streams", streams_command)
    )
    topic_command.add_parser(commands).set_defaults(handler=topic_command.run)
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
