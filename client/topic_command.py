"""`keyrange topic create|list|produce`: make a topic and put test records in it.

Every section of the README and docs needs a topic with records before anything happens; these
commands give a newcomer both without a second toolchain (Kafka's shell scripts, kcat). They
talk to Kafka only, need only what `pip install keyrange` brings, and create nothing that was
not asked for: `produce` refuses a topic that does not exist rather than let the broker
auto-create it with a partition count of its own.

Exit codes: 0 on success, 1 when Kafka refused or could not be reached, 2 for bad options
(a topic that exists already, or does not exist for `produce`, included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"  # the broker `make run` embeds
BOOTSTRAP_VARIABLE = "KEYRANGE_BOOTSTRAP"
PROGRESS_INTERVAL_S = 2.0


class TopicCommandError(Exception):
    """A bad request: one line for the user, exit code 2."""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The `topic` subcommand on the `keyrange` parser's subparsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "topic",
        help="create or list Kafka topics and produce test records (for trying Keyrange out)",
        description=f"Kafka at --bootstrap, else {BOOTSTRAP_VARIABLE}, else {DEFAULT_BOOTSTRAP} "
        "(the broker `make run` starts).",
    )
    actions = parser.add_subparsers(dest="topic_action", required=True)

    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=_positive, default=1, help="default 1")
    create.add_argument("--replication-factor", type=_positive, default=1, help="default 1")
    create.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topic setting, e.g. cleanup.policy=compact (repeatable)",
    )

    actions.add_parser("list", help="list topics with their partition counts")

    produce = actions.add_parser("produce", help="produce test records to an existing topic")
    produce.add_argument("name")
    produce.add_argument("--count", type=_positive, default=1000, help="records (default 1000)")
    produce.add_argument(
        "--keys", type=_positive, default=100, help="distinct keys key-0.. (default 100)"
    )
    produce.add_argument(
        "--value", default=None, help="the value of every record (default: JSON with its number)"
    )
    for action in actions.choices.values():
        action.add_argument("--bootstrap", default=None, help="Kafka's bootstrap servers")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def run(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError

    bootstrap = args.bootstrap or os.environ.get(BOOTSTRAP_VARIABLE) or DEFAULT_BOOTSTRAP
    # Kafka's client logs every failed connection; the one line below says what failed.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    actions = {"create": _create, "list": _list, "produce": _produce}
    try:
        asyncio.run(actions[args.topic_action](bootstrap, args))
    except TopicCommandError as error:
        print(f"keyrange topic: {error}", file=sys.stderr)
        return 2
    except KafkaError as error:
        print(
            f"keyrange topic: Kafka at {bootstrap}: {type(error).__name__}: {error}",
            file=sys.stderr,
        )
        return 1
    return 0


def _settings(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise TopicCommandError(f"--config {pair!r} is not KEY=VALUE")
        settings[key.strip()] = value.strip()
    return settings


async def _partition_counts(bootstrap: str) -> dict[str, int]:
    """Every topic's partition count, from a metadata request that creates none."""
    from aiokafka import AIOKafkaConsumer

    kafka = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    try:
        await kafka.start()
        names = await kafka.topics()
        return {name: len(kafka.partitions_for_topic(name) or ()) for name in names}
    finally:
        await kafka.stop()


async def _create(bootstrap: str, args: argparse.Namespace) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    settings = _settings(args.config)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        topic = NewTopic(
            args.name, args.partitions, args.replication_factor, topic_configs=settings
        )
        reply = await admin.create_topics([topic])
    finally:
        await admin.close()
    for name, code, message in _topic_errors(reply):
        if code == TopicAlreadyExistsError.errno:
            raise TopicCommandError(f"topic {name!r} exists already")
        raise TopicCommandError(f"topic {name!r} was not created: {message or code}")
    print(f"created topic {args.name} with {args.partitions} partition(s)")


def _topic_errors(reply: Any) -> list[tuple[str, int, str | None]]:
    """The (topic, error code, message) of each topic the broker refused."""
    refused = []
    for entry in getattr(reply, "topic_errors", ()):
        name, code = entry[0], entry[1]
        if code:
            refused.append((name, code, entry[2] if len(entry) > 2 else None))
    return refused


async def _list(bootstrap: str, args: argparse.Namespace) -> None:
    counts = await _partition_counts(bootstrap)
    if not counts:
        print("no topics")
    for name in sorted(counts):
        print(f"{name}\t{counts[name]} partition(s)")


async def _produce(bootstrap: str, args: argparse.Namespace) -> None:
    from aiokafka import AIOKafkaProducer

    counts = await _partition_counts(bootstrap)
    if args.name not in counts:
        raise TopicCommandError(
            f"topic {args.name!r} does not exist; create it first: "
            f"keyrange topic create {args.name} --partitions N"
        )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        await producer.start()
        reported = time.monotonic()
        for number in range(args.count):
            value = args.value if args.value is not None else json.dumps({"n": number})
            key = f"key-{number % args.keys}"
            await producer.send(args.name, value=value.encode(), key=key.encode())
            if time.monotonic() - reported >= PROGRESS_INTERVAL_S:
                reported = time.monotonic()
                print(f"  {number + 1} of {args.count} sent", file=sys.stderr)
        await producer.flush()
    finally:
        await producer.stop()
    print(
        f"produced {args.count} records with {min(args.keys, args.count)} keys "
        f"to {args.name} ({counts[args.name]} partition(s))"
    )
