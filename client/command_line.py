"""What the client's commands (`keyrange worker`, `keyrange streams`) share: options that are
flags and ``KEYRANGE_<COMMAND>_<OPTION>`` variables alike (a flag wins over the variable, the
variable over the default), the log options, the Kafka security options, the target a command
loads, and the one-line usage error. A container is configured by variables, a shell by
flags, with one table."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from client.kafka_security import KafkaSecurity


class UsageError(Exception):
    """Bad options or target: one line for the user, exit code 2."""


@dataclass(frozen=True)
class Option:
    flag: str
    field: str
    parse: Callable[[str], Any]
    help: str


@dataclass(frozen=True)
class Options:
    """One command's option table, under its variable prefix."""

    prefix: str
    table: Sequence[Option]
    required: Sequence[str]

    def env(self, option: Option) -> str:
        return self.prefix + option.flag.upper().replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Every option, then ``--log-level`` and ``--log-format``."""
        for option in self.table:
            parser.add_argument(
                f"--{option.flag}", default=None, help=f"{option.help} ({self.env(option)})"
            )
        parser.add_argument(
            "--log-level", default=None, help=f"log level, default INFO ({self.prefix}LOG_LEVEL)"
        )
        parser.add_argument(
            "--log-format",
            default=None,
            help="auto (text on a terminal, JSON elsewhere; the default), text or json "
            f"({self.prefix}LOG_FORMAT)",
        )

    def settings(self, args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
        """The fields set by a flag or a variable; UsageError naming the flag or variable
        of a bad value, or every required one missing."""
        chosen: dict[str, Any] = {}
        for option in self.table:
            raw = getattr(args, option.flag.replace("-", "_"))
            source = f"--{option.flag}"
            if raw is None:
                raw, source = environ.get(self.env(option)), self.env(option)
            if raw is None:
                continue
            try:
                chosen[option.field] = option.parse(raw)
            except ValueError:
                raise UsageError(f"{source}: invalid value {raw!r}") from None
        missing = [o for o in self.table if o.field in self.required and o.field not in chosen]
        if missing:
            raise UsageError("missing " + ", ".join(f"--{o.flag} ({self.env(o)})" for o in missing))
        return chosen

    def logging(self, args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str]:
        level = args.log_level or environ.get(f"{self.prefix}LOG_LEVEL") or "INFO"
        fmt = args.log_format or environ.get(f"{self.prefix}LOG_FORMAT") or "auto"
        return level.upper(), fmt


def boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"true", "1", "yes", "on"}:
        return True
    if lowered in {"false", "0", "no", "off"}:
        return False
    raise ValueError("expected true or false")


# The coordinator's KEYRANGE_KAFKA_* settings under each command's prefix (the chart sets them
# all from the same values), so every Keyrange process reaches a secured cluster the same way;
# docs/kafka-security.md.
KAFKA_SECURITY_OPTIONS = (
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
    Option("kafka-ssl-check-hostname", "kafka_ssl_check_hostname", boolean, "true (default)"),
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
_KAFKA_SECURITY_FIELDS = frozenset(option.field for option in KAFKA_SECURITY_OPTIONS)


def kafka_security(chosen: dict[str, Any]) -> dict[str, Any]:
    """``chosen`` with its ``kafka_*`` security fields gathered into one ``kafka_security``
    (a ``KafkaSecurity``), the field the worker's and the streams' configs take; the config
    checks the combination, so a bad one is a usage error like any other bad value."""
    security = {
        name.removeprefix("kafka_").replace("security_protocol", "protocol"): chosen.pop(name)
        for name in [name for name in chosen if name in _KAFKA_SECURITY_FIELDS]
    }
    if security:
        chosen["kafka_security"] = KafkaSecurity(**security)
    return chosen


def load_target(spec: str) -> Any:
    """``module:Name`` (``Name`` may be dotted), imported; UsageError when it is not there."""
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
