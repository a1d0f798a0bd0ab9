"""``kafka.*`` options by their Kafka (Java client) names, as Spark's Kafka source takes them.

Security properties become a ``KafkaSecurity`` (client/kafka_security.py), the model the
coordinator and the workers use, so a JAAS line, a PEM trust store or a SASL mechanism means
the same here as there and is checked the same way, on the driver, before any task runs.
The common consumer and producer properties map onto aiokafka's arguments. The aiokafka
names the source took before (``kafka.security_protocol``) keep working; a property and its
aiokafka name set to different values is an error naming both.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from client.kafka_security import (
    KAFKA_PROPERTY_NAMES,
    KAFKA_SECURITY_PROPERTIES,
    KafkaPropertyError,
    KafkaSecurity,
    security_from_kafka_properties,
)

Role = Literal["consumer", "producer"]

PREFIX = "kafka."
BOOTSTRAP = "kafka.bootstrap.servers"
_INT_SUFFIXES = ("_ms", "_bytes", "_size", "_records", "_retries")
_BOOL_PREFIXES = ("enable_", "check_", "allow_")

# Kafka property -> aiokafka argument, per role; the value's type follows the argument.
_CONSUMER = {
    "fetch.max.bytes": "fetch_max_bytes",
    "max.partition.fetch.bytes": "max_partition_fetch_bytes",
    "fetch.min.bytes": "fetch_min_bytes",
    "fetch.max.wait.ms": "fetch_max_wait_ms",
    "isolation.level": "isolation_level",
    "request.timeout.ms": "request_timeout_ms",
    "client.id": "client_id",
    "client.rack": "client_rack",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
    "check.crcs": "check_crcs",
}
_PRODUCER = {
    "request.timeout.ms": "request_timeout_ms",
    "client.id": "client_id",
    "linger.ms": "linger_ms",
    "batch.size": "max_batch_size",
    "max.request.size": "max_request_size",
    "compression.type": "compression_type",
    "metadata.max.age.ms": "metadata_max_age_ms",
    "retry.backoff.ms": "retry_backoff_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
}
# aiokafka names of the security properties: the source's earlier spelling of them.
_LEGACY_SECURITY = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
}
_LEGACY_CREDENTIALS = ("sasl_plain_username", "sasl_plain_password")
# Properties Spark's Kafka source refuses too, with its reasons, and what this client
# decides for itself.
_REFUSED = {
    "bootstrap.servers": "set kafka.bootstrap.servers",
    "group.id": "the readers join no Kafka consumer group; the commit group is option 'group'",
    "auto.offset.reset": "set startingOffsets (or auto_offset_reset for the group's position)",
    "enable.auto.commit": "nothing is committed to Kafka; finished batches go to the coordinator",
    "key.deserializer": "keys are always bytes; cast the key column",
    "value.deserializer": "values are always bytes; cast the value column",
    "interceptor.classes": "Java interceptors do not run in a Python client",
    "key.serializer": "the sink writes the key column's bytes or string",
    "value.serializer": "the sink writes the value column's bytes or string",
    "acks": "the sink always waits for acks=all, so a finished task's rows are in Kafka",
    "enable.idempotence": "the sink delivers at least once, as Spark's Kafka sink",
    "transactional.id": "the sink delivers at least once, as Spark's Kafka sink",
}
_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


class KafkaSettingError(ValueError):
    """A ``kafka.*`` option is unknown, refused or malformed."""


@dataclass(frozen=True)
class KafkaSettings:
    """What a Kafka client needs besides the bootstrap servers; plain data, so it pickles to
    executors, where ``client_arguments`` builds the TLS context."""

    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def read_committed(self) -> bool:
        return self.arguments.get("isolation_level") == "read_committed"

    def client_arguments(self) -> dict[str, Any]:
        return {**self.arguments, **self.security.aiokafka_options()}


def parse_kafka_settings(options: Mapping[str, str], role: Role) -> KafkaSettings:
    """The ``kafka.*`` entries of lower-cased ``options`` (``kafka.bootstrap.servers`` aside)."""
    mapped = _CONSUMER if role == "consumer" else _PRODUCER
    legacy_names = _aiokafka_arguments(role)
    security: dict[str, str] = {}
    arguments: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, raw in sorted(options.items()):
        if not key.startswith(PREFIX) or key == BOOTSTRAP:
            continue
        name = key[len(PREFIX) :]
        refused = _REFUSED.get(name.replace("_", "."))
        if refused is not None:
            raise KafkaSettingError(f"option {key!r} is not supported: {refused}")
        if name in KAFKA_SECURITY_PROPERTIES:
            _put(security, origin, name, raw, key)
        elif name in _LEGACY_SECURITY:
            _put(security, origin, _LEGACY_SECURITY[name], raw, key)
        elif name in mapped:
            _put(arguments, origin, mapped[name], _typed(key, mapped[name], raw), key)
        elif name in legacy_names and name not in ("ssl_context", "sasl_oauth_token_provider"):
            _put(arguments, origin, name, _typed(key, name, raw), key)
        else:
            raise KafkaSettingError(
                f"option {key!r} is not a Kafka {role} setting Keyrange knows; known: "
                + ", ".join(PREFIX + known for known in known_settings(role))
            )
    isolation = arguments.get("isolation_level")
    if isolation is not None and isolation not in _ISOLATION_LEVELS:
        raise KafkaSettingError(
            f"option 'kafka.isolation.level' must be read_committed or read_uncommitted, "
            f"got {isolation!r}"
        )
    return KafkaSettings(_security(security, arguments), arguments)


def known_settings(role: Role) -> list[str]:
    """The Kafka property names ``kafka.*`` accepts for ``role``, for messages and docs."""
    mapped = _CONSUMER if role == "consumer" else _PRODUCER
    return sorted({"bootstrap.servers", *KAFKA_SECURITY_PROPERTIES, *mapped})


def kafka_arguments(settings: Mapping[str, str]) -> dict[str, Any]:
    """aiokafka argument strings typed by the argument's name, never by its value: a
    password of digits stays a string."""
    return {name: _typed(name, name, raw) for name, raw in settings.items()}


def _typed(option: str, argument: str, raw: str) -> Any:
    if argument.endswith(_INT_SUFFIXES):
        try:
            return int(raw)
        except ValueError:
            raise KafkaSettingError(f"option {option!r} must be an integer, got {raw!r}") from None
    if argument.startswith(_BOOL_PREFIXES) or argument == "check_crcs":
        return raw.strip().lower() == "true"
    return raw


def _put(target: dict[str, Any], origin: dict[str, str], name: str, value: Any, key: str) -> None:
    if name in target and target[name] != value:
        raise KafkaSettingError(
            f"options {origin[name]!r} and {key!r} set the same Kafka setting to different "
            f"values ({target[name]!r}, {value!r}); set one"
        )
    target[name] = value
    origin[name] = key


def _security(properties: dict[str, str], arguments: dict[str, Any]) -> KafkaSecurity:
    credentials = {name: arguments.pop(name) for name in _LEGACY_CREDENTIALS if name in arguments}
    try:
        security = security_from_kafka_properties(properties)
    except KafkaPropertyError as error:
        raise KafkaSettingError(f"kafka.{error}") from None
    if credentials:
        if security.sasl_username is not None:
            raise KafkaSettingError(
                "options 'kafka.sasl.jaas.config' and 'kafka.sasl_plain_username' both give "
                "the SASL credentials; set one"
            )
        security = KafkaSecurity(
            **{
                **security.__dict__,
                "sasl_username": credentials.get("sasl_plain_username"),
                "sasl_password": credentials.get("sasl_plain_password"),
            }
        )
    problems = security.problems()
    if problems:
        raise KafkaSettingError("; ".join(_in_kafka_names(problem) for problem in problems))
    return security


def _in_kafka_names(problem: str) -> str:
    for setting, kafka_name in KAFKA_PROPERTY_NAMES.items():
        problem = problem.replace(setting, f"kafka.{kafka_name}")
    return problem


def _aiokafka_arguments(role: Role) -> frozenset[str]:
    client = AIOKafkaConsumer if role == "consumer" else AIOKafkaProducer
    return frozenset(inspect.signature(client.__init__).parameters) - {"self", "loop", "topics"}
