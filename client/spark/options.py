"""The ``keyrange`` data source's options, parsed once into a typed value.

The source takes the options of Spark's own Kafka source, by Spark's names and with their
meaning (``subscribe``, ``startingOffsets``, ``kafka.bootstrap.servers``, ...), so a pipeline
ports by changing ``format("kafka")`` to ``format("keyrange")`` and adding ``coordinator`` and
``group``. Keyrange's earlier names stay as aliases; an alias and its Spark name set to
different values is an error naming both. Spark options Keyrange cannot honour are refused
with the reason, never ignored (docs/spark.md, "Spark's Kafka source options").

Spark hands options over as a case-insensitive map of strings; parsing them in one place
means a typo fails at planning time on the driver with a message naming the option, rather
than as a confusing error inside an executor task.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

from aiokafka.structs import TopicPartition

from client.protocol.log_bounds import OFFSET_RESETS, OffsetReset
from client.spark.kafka_settings import (
    BOOTSTRAP,
    KafkaSettingError,
    KafkaSettings,
    parse_kafka_settings,
)

SliceBy = Literal["keys", "offsets"]
StartingMode = Literal["committed", "earliest", "latest"]
# Per partition: an offset, or Spark's sentinels -2 (earliest) and -1 (latest).
EARLIEST, LATEST = -2, -1


@dataclass(frozen=True)
class ByTimestamp:
    """Offsets found by record timestamp (ms): per partition, or ``every`` partition.

    ``when_missing``: no record at or after the timestamp; ``error`` fails the query and
    ``latest`` starts at the log end (Spark's ``startingOffsetsByTimestampStrategy``).
    """

    partitions: dict[TopicPartition, int] = field(default_factory=dict)
    every: int | None = None
    when_missing: Literal["error", "latest"] = "error"


Starting = StartingMode | dict[TopicPartition, int] | ByTimestamp
Ending = Literal["latest"] | dict[TopicPartition, int] | ByTimestamp

TOKEN_ENV = "KEYRANGE_COORDINATOR_TOKEN"

# Spark name -> Keyrange's earlier name for the same option (lower case: Spark's option
# map is case-insensitive).
ALIASES = {
    BOOTSTRAP: "bootstrap",
    "subscribe": "topics",
    "startingoffsets": "starting_offsets",
    "endingoffsets": "ending_offsets",
    "maxoffsetspertrigger": "max_records_per_trigger",
}
# Spark's spelling, for messages.
_SPARK_NAMES = {
    name.lower(): name
    for name in (
        "kafka.bootstrap.servers",
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "startingOffsetsByTimestamp",
        "endingTimestamp",
        "endingOffsetsByTimestamp",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "maxRecordsPerPartition",
        "minPartitions",
        "failOnDataLoss",
        "includeHeaders",
        "groupIdPrefix",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "kafkaConsumer.pollTimeoutMs",
        "startingOffsetsByTimestampStrategy",
    )
}
# Spark Kafka source options Keyrange cannot honour, and why.
REFUSED = {
    "groupidprefix": "the readers join no Kafka consumer group, so there is no group id to "
    "prefix (the commit group is option 'group')",
    "fetchoffset.numretries": "offsets are read through aiokafka, which retries within "
    "kafka.request.timeout.ms; set that instead",
    "fetchoffset.retryintervalms": "offsets are read through aiokafka, which retries within "
    "kafka.request.timeout.ms; set that instead",
}
# The options that only bound a batch read; Spark refuses them on a stream as well.
BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


class OptionError(ValueError):
    """An option of the ``keyrange`` data source is missing, malformed or refused."""


@dataclass(frozen=True)
class Subscription:
    """Which partitions a read covers: named topics, topics matching an RE2 pattern, or
    assigned partitions (Spark's ``subscribe``, ``subscribePattern``, ``assign``)."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[TopicPartition, ...] = ()


# The option ``plan_batch_read`` adds to the options it pins (lower case, as options are read).
PLANNED_BATCH_OPTION = "keyrange.planned_batch"


@dataclass(frozen=True)
class SourceOptions:
    """What the reader needs: where to read, how to slice, where to start and stop."""

    bootstrap: str
    subscription: Subscription
    coordinator_url: str | None = None
    group: str | None = None
    coordinator_token: str | None = None
    slices_per_partition: int = 1
    slice_by: SliceBy = "offsets"
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    starting: Starting = "earliest"
    ending: Ending = "latest"
    batch_only: tuple[str, ...] = ()
    max_records_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_s: float = 900.0
    auto_offset_reset: OffsetReset = "earliest"
    fail_on_data_loss: bool = False
    include_headers: bool = False
    poll_timeout_s: float = 60.0
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    # Leave out records the group has processed: by default only when the group's position
    # chose the start (``startingOffsets`` unset or ``committed``); an explicit start reads
    # every record from there, as Spark's own source does.
    skip_processed: bool = True
    # Set by ``plan_batch_read`` on the options it pins: the read is reported by its commit.
    planned_batch: bool = False

    @property
    def outside_log_reset(self) -> OffsetReset:
        """What a position outside the log moves to: ``failOnDataLoss=true`` fails instead."""
        return "none" if self.fail_on_data_loss else self.auto_offset_reset

    @property
    def outside_log_rule(self) -> str:
        return (
            "failOnDataLoss is true"
            if self.fail_on_data_loss
            else f"auto_offset_reset is {self.auto_offset_reset!r}"
        )


@dataclass(frozen=True)
class SinkOptions:
    """What the Kafka sink needs: the cluster, the target topic and client settings."""

    bootstrap: str
    topic: str
    kafka: KafkaSettings = field(default_factory=KafkaSettings)


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    lowered = _lowered(options)
    for name, reason in REFUSED.items():
        if name in lowered:
            raise OptionError(f"option {_spark(name)!r} is not supported: {reason}")
    coordinator_url = lowered.get("coordinator") or None
    group = lowered.get("group") or None
    if (coordinator_url is None) != (group is None):
        raise OptionError("options 'coordinator' and 'group' go together: set both or neither")
    # Without a coordinator there is no committed position; starting at the earliest
    # record then loses nothing, as a fresh Kafka consumer with auto.offset.reset=earliest.
    starting = _parse_starting(lowered, "earliest" if coordinator_url is None else "committed")
    if starting == "committed" and coordinator_url is None:
        raise OptionError("starting_offsets=committed needs the 'coordinator' and 'group' options")
    slice_by = lowered.get("slice_by", "offsets")
    if slice_by not in ("keys", "offsets"):
        raise OptionError(f"option 'slice_by' must be 'keys' or 'offsets', got {slice_by!r}")
    max_per_partition = _optional_int(lowered, "maxrecordsperpartition")
    if max_per_partition is not None and slice_by == "keys":
        raise OptionError(
            "option 'maxRecordsPerPartition' needs slice_by=offsets: a key slice reads its "
            "partition's whole offset range"
        )
    max_records = _optional_int(lowered, "maxoffsetspertrigger")
    min_records = _optional_int(lowered, "minoffsetspertrigger")
    if max_records is not None and min_records is not None and min_records > max_records:
        raise OptionError("option 'minOffsetsPerTrigger' is above 'maxOffsetsPerTrigger'")
    return SourceOptions(
        bootstrap=_required(lowered, BOOTSTRAP),
        subscription=_parse_subscription(lowered),
        coordinator_url=coordinator_url,
        group=group,
        coordinator_token=lowered.get("coordinator_token") or os.environ.get(TOKEN_ENV) or None,
        slices_per_partition=_positive_int(lowered, "slices_per_partition", "1"),
        slice_by="keys" if slice_by == "keys" else "offsets",
        min_partitions=_optional_int(lowered, "minpartitions"),
        max_records_per_partition=max_per_partition,
        starting=starting,
        ending=_parse_ending(lowered),
        batch_only=tuple(name for name in BATCH_ONLY if _given(lowered, name.lower())),
        max_records_per_trigger=max_records,
        min_records_per_trigger=min_records,
        max_trigger_delay_s=_duration_s(lowered, "maxtriggerdelay", "15m"),
        auto_offset_reset=_parse_reset(lowered),
        fail_on_data_loss=_parse_fail_on_data_loss(lowered),
        include_headers=_boolean(lowered, "includeheaders", "false"),
        poll_timeout_s=_positive_int(lowered, "kafkaconsumer.polltimeoutms", "60000") / 1000,
        kafka=_kafka(lowered, "consumer"),
        skip_processed=_boolean(
            lowered, "skip_processed", "true" if starting == "committed" else "false"
        ),
        planned_batch=_boolean(lowered, PLANNED_BATCH_OPTION, "false"),
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    lowered = _lowered(options)
    return SinkOptions(
        bootstrap=_required(lowered, BOOTSTRAP),
        topic=_required(lowered, "topic"),
        kafka=_kafka(lowered, "producer"),
    )


def includes_headers(options: Mapping[str, str]) -> bool:
    """Spark's ``includeHeaders``: whether rows carry the ``headers`` column (schema time)."""
    return _boolean(_lowered(options), "includeheaders", "false")


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> str:
    """The ``{"topic": {"partition": offset}}`` shape Spark's Kafka source uses too."""
    document: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        document.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return json.dumps(document)


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased keys, each Keyrange alias folded into its Spark name."""
    lowered = {key.lower(): value for key, value in options.items()}
    for spark_name, alias in ALIASES.items():
        if alias not in lowered:
            continue
        value = lowered.pop(alias)
        if spark_name in lowered and lowered[spark_name] != value:
            raise OptionError(
                f"options {_spark(spark_name)!r} and {alias!r} are the same option with "
                f"different values ({lowered[spark_name]!r}, {value!r}); set one"
            )
        lowered[spark_name] = value
    return lowered


def _spark(name: str) -> str:
    return _SPARK_NAMES.get(name, name)


def _given(options: Mapping[str, str], name: str) -> bool:
    return bool(options.get(name))


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name)
    if not value:
        alias = ALIASES.get(name)
        also = f" (or {alias!r})" if alias else ""
        raise OptionError(f"option {_spark(name)!r}{also} is required")
    return value


def _positive_int(options: Mapping[str, str], name: str, default: str | None = None) -> int:
    raw = options.get(name, default)
    try:
        value = int(str(raw))
    except ValueError:
        raise OptionError(
            f"option {_spark(name)!r} must be a positive integer, got {raw!r}"
        ) from None
    if value < 1:
        raise OptionError(f"option {_spark(name)!r} must be a positive integer, got {value}")
    return value


def _optional_int(options: Mapping[str, str], name: str) -> int | None:
    return _positive_int(options, name) if _given(options, name) else None


def _boolean(options: Mapping[str, str], name: str, default: str) -> bool:
    raw = options.get(name, default).strip().lower()
    if raw not in ("true", "false"):
        raise OptionError(f"option {_spark(name)!r} must be true or false, got {raw!r}")
    return raw == "true"


def _duration_s(options: Mapping[str, str], name: str, default: str) -> float:
    raw = options.get(name, default)
    match = _DURATION.match(raw)
    if match is None:
        raise OptionError(
            f"option {_spark(name)!r} must be a duration like 15m or 30s, got {raw!r}"
        )
    return int(match.group(1)) * _DURATION_S[(match.group(2) or "ms").lower()]


def _parse_subscription(options: Mapping[str, str]) -> Subscription:
    given = [name for name in ("subscribe", "subscribepattern", "assign") if _given(options, name)]
    if len(given) != 1:
        named = ", ".join(_spark(name) for name in given) or "none"
        raise OptionError(
            "exactly one of 'subscribe' (or 'topics'), 'subscribePattern' and 'assign' is "
            f"required, got {named}"
        )
    raw = options[given[0]]
    if given[0] == "subscribe":
        topics = tuple(sorted({topic.strip() for topic in raw.split(",") if topic.strip()}))
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return Subscription(topics=topics)
    if given[0] == "subscribepattern":
        return Subscription(pattern=raw)
    return Subscription(assign=_parse_assign(raw))


def _parse_assign(raw: str) -> tuple[TopicPartition, ...]:
    document = _json(raw)
    if not isinstance(document, dict) or not all(
        isinstance(partitions, list)
        and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions)
        for partitions in document.values()
    ):
        raise OptionError(f"option 'assign' must be JSON like {{\"topic\": [0, 1]}}, got {raw!r}")
    return tuple(
        sorted({TopicPartition(str(topic), p) for topic, parts in document.items() for p in parts})
    )


def _parse_starting(options: Mapping[str, str], default: str) -> Starting:
    by_timestamp = _parse_by_timestamp(options, "starting")
    if by_timestamp is not None:
        return by_timestamp
    raw = options.get("startingoffsets", default)
    if raw in ("committed", "earliest", "latest"):
        return cast(StartingMode, raw)
    return _parse_offsets_json("startingOffsets", raw, allow=(EARLIEST, LATEST))


def _parse_ending(options: Mapping[str, str]) -> Ending:
    by_timestamp = _parse_by_timestamp(options, "ending")
    if by_timestamp is not None:
        return by_timestamp
    raw = options.get("endingoffsets", "latest")
    if raw == "latest":
        return "latest"
    if raw == "earliest":
        raise OptionError("option 'endingOffsets' cannot be earliest (as in Spark)")
    return _parse_offsets_json("endingOffsets", raw, allow=(LATEST,))


def _parse_by_timestamp(options: Mapping[str, str], which: str) -> ByTimestamp | None:
    """Spark's ``<which>Timestamp`` / ``<which>OffsetsByTimestamp`` (the first wins, as in
    Spark, which also ranks both above ``<which>Offsets``)."""
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {strategy!r}"
        )
    # A missing ending timestamp means "read to the end", as in Spark.
    when_missing: Literal["error", "latest"] = (
        "latest" if which == "ending" or strategy == "latest" else "error"
    )
    every = options.get(f"{which}timestamp")
    if every:
        try:
            return ByTimestamp(every=int(every), when_missing=when_missing)
        except ValueError:
            raise OptionError(
                f"option '{which}Timestamp' must be milliseconds since the epoch, got {every!r}"
            ) from None
    per_partition = options.get(f"{which}offsetsbytimestamp")
    if per_partition:
        name = f"{which}OffsetsByTimestamp"
        return ByTimestamp(_parse_offsets_json(name, per_partition), when_missing=when_missing)
    return None


def _parse_offsets_json(
    name: str, raw: str, allow: tuple[int, ...] = ()
) -> dict[TopicPartition, int]:
    document = _json(raw)
    if not isinstance(document, dict):
        raise OptionError(
            f'option {name!r} must be a keyword or JSON like {{"topic": {{"0": 42}}}}, got {raw!r}'
        )
    offsets: dict[TopicPartition, int] = {}
    for topic, partitions in document.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option {name!r}: topic {topic!r} needs a partition -> offset map")
        for partition, offset in partitions.items():
            valid = isinstance(offset, int) and not isinstance(offset, bool)
            if not valid or (offset < 0 and offset not in allow):
                raise OptionError(f"option {name!r}: offset of {topic}/{partition} is {offset!r}")
            offsets[TopicPartition(str(topic), int(partition))] = offset
    return offsets


def _json(raw: str) -> object:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None


def _parse_reset(options: Mapping[str, str]) -> OffsetReset:
    reset = options.get("auto_offset_reset", "earliest")
    if reset not in OFFSET_RESETS:
        raise OptionError(
            f"option 'auto_offset_reset' must be 'earliest', 'latest' or 'none', got {reset!r}"
        )
    return cast(OffsetReset, reset)


def _parse_fail_on_data_loss(options: Mapping[str, str]) -> bool:
    """Spark's ``failOnDataLoss`` over the group's reset rules: ``true`` fails where records
    outside the log would be skipped, ``false`` moves on as ``auto_offset_reset`` says."""
    if not _given(options, "failondataloss"):
        return False
    fail = _boolean(options, "failondataloss", "false")
    reset = options.get("auto_offset_reset")
    if reset is not None and (reset == "none") != fail:
        raise OptionError(
            f"options 'failOnDataLoss' ({str(fail).lower()}) and 'auto_offset_reset' "
            f"({reset}) disagree on positions outside the log; set one"
        )
    return fail


def _kafka(options: Mapping[str, str], role: Literal["consumer", "producer"]) -> KafkaSettings:
    try:
        return parse_kafka_settings(options, role)
    except KafkaSettingError as error:
        raise OptionError(str(error)) from None


def slices_for(size: int, total: int, options: SourceOptions) -> int:
    """Slices for one partition's ``size`` offsets out of ``total`` in the batch.

    ``minPartitions`` shares its count among partitions in proportion to their size, as
    Spark's Kafka source splits offset ranges; ``maxRecordsPerPartition`` caps a slice.
    """
    count = options.slices_per_partition
    if options.min_partitions is not None and total > 0:
        count = max(count, round(size / total * options.min_partitions))
    if options.max_records_per_partition is not None:
        count = max(count, math.ceil(size / options.max_records_per_partition))
    return max(count, 1)
