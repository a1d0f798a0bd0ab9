"""The ``keyrange`` data source's options, parsed once into a typed value.

Spark hands options over as a case-insensitive map of strings; parsing them in one place
means a typo fails at planning time on the driver with a message naming the option, rather
than as a confusing error inside an executor task.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

from aiokafka.structs import TopicPartition

from client.protocol.log_bounds import OFFSET_RESETS, OffsetReset

SliceBy = Literal["keys", "offsets"]
StartingMode = Literal["committed", "earliest", "latest"]
Starting = StartingMode | dict[TopicPartition, int]

TOKEN_ENV = "KEYRANGE_COORDINATOR_TOKEN"
_KAFKA_PREFIX = "kafka."


class OptionError(ValueError):
    """An option of the ``keyrange`` data source is missing or malformed."""


@dataclass(frozen=True)
class SourceOptions:
    """What the reader needs: where to read, how to slice, where to start and stop."""

    bootstrap: str
    topics: tuple[str, ...]
    coordinator_url: str | None = None
    group: str | None = None
    coordinator_token: str | None = None
    slices_per_partition: int = 1
    slice_by: SliceBy = "offsets"
    starting: Starting = "earliest"
    ending: Literal["latest"] | dict[TopicPartition, int] = "latest"
    max_records_per_trigger: int | None = None
    auto_offset_reset: OffsetReset = "earliest"
    kafka: dict[str, str] = field(default_factory=dict)

    @property
    def uses_coordinator(self) -> bool:
        return self.coordinator_url is not None


@dataclass(frozen=True)
class SinkOptions:
    """What the Kafka sink needs: the cluster, the target topic and client settings."""

    bootstrap: str
    topic: str
    kafka: dict[str, str] = field(default_factory=dict)


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    lowered = {key.lower(): value for key, value in options.items()}
    coordinator_url = lowered.get("coordinator") or None
    group = lowered.get("group") or None
    if (coordinator_url is None) != (group is None):
        raise OptionError("options 'coordinator' and 'group' go together: set both or neither")
    # Without a coordinator there is no committed position; starting at the earliest
    # record then loses nothing, as a fresh Kafka consumer with auto.offset.reset=earliest.
    starting = _parse_starting(
        lowered.get("starting_offsets", "earliest" if coordinator_url is None else "committed")
    )
    if starting == "committed" and coordinator_url is None:
        raise OptionError("starting_offsets=committed needs the 'coordinator' and 'group' options")
    slice_by = lowered.get("slice_by", "offsets")
    if slice_by not in ("keys", "offsets"):
        raise OptionError(f"option 'slice_by' must be 'keys' or 'offsets', got {slice_by!r}")
    max_records = lowered.get("max_records_per_trigger")
    reset = lowered.get("auto_offset_reset", "earliest")
    if reset not in OFFSET_RESETS:
        raise OptionError(
            f"option 'auto_offset_reset' must be 'earliest', 'latest' or 'none', got {reset!r}"
        )
    return SourceOptions(
        bootstrap=_required(lowered, "bootstrap"),
        topics=_parse_topics(_required(lowered, "topics")),
        coordinator_url=coordinator_url,
        group=group,
        coordinator_token=lowered.get("coordinator_token") or os.environ.get(TOKEN_ENV) or None,
        slices_per_partition=_positive_int(lowered, "slices_per_partition", "1"),
        slice_by="keys" if slice_by == "keys" else "offsets",
        starting=starting,
        ending=_parse_ending(lowered.get("ending_offsets", "latest")),
        max_records_per_trigger=(
            None if max_records is None else _positive_int(lowered, "max_records_per_trigger")
        ),
        auto_offset_reset=cast(OffsetReset, reset),
        kafka=_kafka_settings(lowered),
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    lowered = {key.lower(): value for key, value in options.items()}
    return SinkOptions(
        bootstrap=_required(lowered, "bootstrap"),
        topic=_required(lowered, "topic"),
        kafka=_kafka_settings(lowered),
    )


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> str:
    """The ``{"topic": {"partition": offset}}`` shape the Kafka connector uses too."""
    document: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        document.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return json.dumps(document)


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name)
    if not value:
        raise OptionError(f"option {name!r} is required")
    return value


def _positive_int(options: Mapping[str, str], name: str, default: str | None = None) -> int:
    raw = options.get(name, default)
    try:
        value = int(str(raw))
    except ValueError:
        raise OptionError(f"option {name!r} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise OptionError(f"option {name!r} must be a positive integer, got {value}")
    return value


def _parse_topics(raw: str) -> tuple[str, ...]:
    topics = tuple(sorted({topic.strip() for topic in raw.split(",") if topic.strip()}))
    if not topics:
        raise OptionError("option 'topics' names no topic")
    return topics


def _parse_starting(raw: str) -> Starting:
    if raw in ("committed", "earliest", "latest"):
        return raw  # type: ignore[return-value]
    return _parse_offsets_json("starting_offsets", raw)


def _parse_ending(raw: str) -> Literal["latest"] | dict[TopicPartition, int]:
    if raw == "latest":
        return "latest"
    return _parse_offsets_json("ending_offsets", raw)


def _parse_offsets_json(name: str, raw: str) -> dict[TopicPartition, int]:
    try:
        document = json.loads(raw)
    except json.JSONDecodeError:
        document = None
    if not isinstance(document, dict):
        raise OptionError(
            f'option {name!r} must be a keyword or JSON like {{"topic": {{"0": 42}}}}, got {raw!r}'
        )
    offsets: dict[TopicPartition, int] = {}
    for topic, partitions in document.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option {name!r}: topic {topic!r} needs a partition -> offset map")
        for partition, offset in partitions.items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise OptionError(f"option {name!r}: offset of {topic}/{partition} is {offset!r}")
            offsets[TopicPartition(str(topic), int(partition))] = offset
    return offsets


def _kafka_settings(options: Mapping[str, str]) -> dict[str, str]:
    """``kafka.<aiokafka argument>`` options, e.g. ``kafka.security_protocol=SASL_SSL``."""
    return {
        key[len(_KAFKA_PREFIX) :]: value
        for key, value in options.items()
        if key.startswith(_KAFKA_PREFIX)
    }
