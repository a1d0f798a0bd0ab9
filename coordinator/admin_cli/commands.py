"""The ``keyrange admin`` sub-commands: their arguments, the admin route each calls and the
view that prints its reply. Tables by default; ``--output json`` prints the reply as the API
sent it, for scripts. ``reset`` plans unless given ``--execute``, as in kafka-consumer-groups."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from coordinator.admin_cli import views
from coordinator.admin_cli.api import AdminApi, AdminError

OUTPUTS = ("table", "json")


@dataclass
class Reply:
    body: Any
    view: Callable[[Any], str]
    # Lines for stderr, after the reply, each printed as "keyrange: <line>".
    notices: list[str] = field(default_factory=list)


Command = Callable[[AdminApi, argparse.Namespace], Reply]


def run(args: argparse.Namespace) -> int:
    api = AdminApi(args.url, args.token)
    try:
        reply = COMMANDS[args.admin_command](api, args)
        printed = json.dumps(reply.body, indent=2) if args.output == "json" else _view(reply)
    except AdminError as exc:
        print(f"keyrange: {exc}", file=sys.stderr)
        return 1
    print(printed)
    for line in reply.notices:
        print(f"keyrange: {line}", file=sys.stderr)
    return 0


def _view(reply: Reply) -> str:
    try:
        return reply.view(reply.body)
    except (KeyError, TypeError, ValueError) as exc:
        raise AdminError(
            f"cannot show the coordinator's reply as a table ({type(exc).__name__}: {exc}); "
            "it may be another version than this command: try --output json"
        ) from None


def _groups(api: AdminApi, args: argparse.Namespace) -> Reply:
    return Reply(api.call("GET", "/v1/admin/groups", "listing groups"), views.groups)


def _describe(api: AdminApi, args: argparse.Namespace) -> Reply:
    body = api.call("GET", f"/v1/admin/groups/{args.group}", f"describing {args.group}")
    return Reply(body, views.group, _outside_log(body))


def _offsets(api: AdminApi, args: argparse.Namespace) -> Reply:
    body = api.call("GET", f"/v1/admin/groups/{args.group}/offsets", "reading offsets")
    return Reply(body, views.offsets, _outside_log(body))


def _reset(api: AdminApi, args: argparse.Namespace) -> Reply:
    request: dict[str, Any] = {
        "topic": args.topic,
        "partitions": args.partitions,
        "force": args.force,
        "dry_run": not args.execute,
    }
    if args.to_offset is not None:
        request["to_offset"] = args.to_offset
    if args.to_earliest:
        request["to_earliest"] = True
    if args.to_latest:
        request["to_latest"] = True
    if args.to_datetime is not None:
        request["to_datetime"] = args.to_datetime.isoformat()
    if args.shift_by is not None:
        request["shift_by"] = args.shift_by
    doing = "resetting offsets" if args.execute else "planning the reset"
    body = api.call("POST", f"/v1/admin/groups/{args.group}/offsets/reset", doing, json=request)
    notices = [] if args.execute else ["dry run, nothing changed: add --execute to apply this plan"]
    return Reply(body, views.reset, notices)


def _delete_offsets(api: AdminApi, args: argparse.Namespace) -> Reply:
    params = {"topic": args.topic} if args.topic else None
    return Reply(
        api.call(
            "DELETE", f"/v1/admin/groups/{args.group}/offsets", "deleting offsets", params=params
        ),
        views.deleted,
    )


def _delete_group(api: AdminApi, args: argparse.Namespace) -> Reply:
    return Reply(
        api.call("DELETE", f"/v1/admin/groups/{args.group}", "deleting the group"), views.deleted
    )


def _rebalance(api: AdminApi, args: argparse.Namespace) -> Reply:
    return Reply(
        api.call("POST", f"/v1/admin/groups/{args.group}/rebalance", "rebalancing"),
        views.rebalanced,
    )


def _remove_member(api: AdminApi, args: argparse.Namespace) -> Reply:
    path = f"/v1/admin/groups/{args.group}/members/{args.member}"
    return Reply(api.call("DELETE", path, "removing the member"), views.removed)


def _topic_config(api: AdminApi, args: argparse.Namespace) -> Reply:
    path = f"/v1/admin/topics/{args.topic}/config"
    if args.accept_range_fetch is None:
        return Reply(api.call("GET", path, "reading the topic config"), views.topic_config)
    body = api.call(
        "PUT",
        path,
        "setting the topic config",
        json={"accept_range_fetch": args.accept_range_fetch},
    )
    return Reply(body, views.topic_config)


def _config(api: AdminApi, args: argparse.Namespace) -> Reply:
    if args.accept_individual_commit is None and args.default_accept_range_fetch is None:
        return Reply(api.call("GET", "/v1/admin/config", "reading the config"), views.config)
    body = api.call(
        "PUT",
        "/v1/admin/config",
        "setting the config",
        json={
            "accept_individual_commit": args.accept_individual_commit,
            "default_accept_range_fetch": args.default_accept_range_fetch,
        },
    )
    return Reply(body, views.config)


COMMANDS: dict[str, Command] = {
    "groups": _groups,
    "describe": _describe,
    "offsets": _offsets,
    "reset": _reset,
    "delete-offsets": _delete_offsets,
    "delete-group": _delete_group,
    "rebalance": _rebalance,
    "remove-member": _remove_member,
    "topic-config": _topic_config,
    "config": _config,
}


def _outside_log(body: Any) -> list[str]:
    """A warning per partition whose stored offset is past the log end, saying how to fix it."""
    partitions = body.get("partitions", []) if isinstance(body, dict) else []
    return [
        f"warning: {entry['topic']}[{entry['partition']}]: stored offset "
        f"{entry['stable_offset']} is past the log end {entry['high_watermark']}; consumers "
        f"apply auto_offset_reset, or reset it with: keyrange admin reset "
        f"{body.get('group_id')} --topic {entry['topic']} --partitions {entry['partition']} "
        "--to-earliest --execute"
        for entry in partitions
        if entry.get("offset_out_of_range")
    ]


def _partitions(value: str) -> list[int]:
    try:
        partitions = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        partitions = []
    if not partitions:
        raise argparse.ArgumentTypeError("expected comma-separated partition numbers, e.g. 0,1,2")
    return partitions


def _boolean(value: str) -> bool:
    lowered = value.lower()
    if lowered in {"true", "on", "yes", "1"}:
        return True
    if lowered in {"false", "off", "no", "0"}:
        return False
    raise argparse.ArgumentTypeError("expected true or false")


def _coordinator_url(value: str) -> str:
    """An http(s) URL with a host, checked before anything is asked of it."""
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a URL: {exc}") from None
    if url.scheme not in {"http", "https"} or not url.host:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a coordinator URL such as http://127.0.0.1:8080"
        )
    return value


def _local_or_zoned_time(value: str) -> datetime:
    """An ISO 8601 time; without a zone it is local time, as kafka-consumer-groups reads it."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "expected an ISO 8601 time such as 2026-11-25T03:00:00 (local time) or "
            "2026-11-25T03:00:00Z"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.astimezone()


def _add_common_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """``--url``, ``--token`` and ``--output``; only the ``admin`` level sets defaults, so a
    value given after the sub-command is not overwritten by one the sub-command never saw."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--url",
        default=default(os.environ.get("KEYRANGE_URL", "http://127.0.0.1:8080")),
        type=_coordinator_url,
        help="coordinator URL (KEYRANGE_URL)",
    )
    parser.add_argument(
        "--token",
        default=default(os.environ.get("KEYRANGE_TOKEN")),
        help="admin bearer token (KEYRANGE_TOKEN; prefer the variable: arguments show in ps)",
    )
    parser.add_argument(
        "--output",
        "-o",
        choices=OUTPUTS,
        default=default("table"),
        help="table (default) or json: the API's reply as it came, for scripts",
    )


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``admin`` and its sub-commands on the ``keyrange`` sub-parsers."""
    admin = commands.add_parser("admin", help="administer groups and offsets over the admin API")
    _add_common_options(admin, defaults=True)
    # Accepted after the sub-command too (``keyrange admin groups --url ...``), as users type it.
    common = argparse.ArgumentParser(add_help=False)
    _add_common_options(common, defaults=False)
    admin_commands = admin.add_subparsers(dest="admin_command", required=True)

    def admin_command(name: str, text: str) -> argparse.ArgumentParser:
        return admin_commands.add_parser(name, help=text, description=text, parents=[common])

    admin_command("groups", "list groups")
    for name, text in (
        ("describe", "describe a group: offsets and lag per partition, key-range owners, members"),
        ("offsets", "show a group's offsets with lag"),
        ("delete-group", "delete an empty group and its offsets"),
        ("rebalance", "recompute a group's target assignment now"),
    ):
        admin_command(name, text).add_argument("group")
    _add_reset(admin_command)
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
    return admin


def _add_reset(admin_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    reset = admin_command(
        "reset",
        "reset an empty group's offsets; shows the plan unless --execute is given "
        "(without a target, drops the IC ranges and watermarks only)",
    )
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    reset.add_argument(
        "--partitions",
        type=_partitions,
        help="e.g. 0,1,2 (default: the partitions the group has offsets for)",
    )
    target = reset.add_mutually_exclusive_group()
    target.add_argument("--to-offset", type=int, metavar="OFFSET", help="to this offset")
    target.add_argument("--to-earliest", action="store_true", help="to the log start")
    target.add_argument("--to-latest", action="store_true", help="to the log end")
    target.add_argument(
        "--to-datetime",
        type=_local_or_zoned_time,
        metavar="TIME",
        help="to the first record at or after TIME (ISO 8601; local time unless it has a zone)",
    )
    target.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="by N from the stored offset (negative: back), kept within the log",
    )
    reset.add_argument(
        "--force",
        action="store_true",
        help="with --to-offset: reset even past the log end or on a partition the topic lacks",
    )
    run_mode = reset.add_mutually_exclusive_group()
    run_mode.add_argument(
        "--dry-run", action="store_true", help="show the plan, change nothing (the default)"
    )
    run_mode.add_argument("--execute", action="store_true", help="apply the reset")
