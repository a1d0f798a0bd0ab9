"""Spark's Kafka source options with their meaning, Keyrange's names as aliases, refusals with
a reason, and ``kafka.*`` client settings by their Kafka names (pure: no Spark, no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition

from client.kafka_security import KafkaSecurity, parse_jaas_config
from client.spark.kafka_settings import known_settings, parse_kafka_settings
from client.spark.options import (
    EARLIEST,
    LATEST,
    ByTimestamp,
    OptionError,
    Subscription,
    parse_sink_options,
    parse_source_options,
    slices_for,
)
from client.spark.topic_pattern import InvalidTopicPattern, matching_topics

SPARK = {"kafka.bootstrap.servers": "k:9092", "subscribe": "orders"}
KEYRANGE = {"bootstrap": "k:9092", "topics": "orders"}


def test_spark_names_and_keyrange_names_mean_the_same() -> None:
    spark = parse_source_options(
        {
            **SPARK,
            "startingOffsets": '{"orders": {"0": 5, "1": -2, "2": -1}}',
            "endingOffsets": '{"orders": {"0": 9, "1": -1}}',
            "maxOffsetsPerTrigger": "100",
        }
    )
    keyrange = parse_source_options(
        {
            **KEYRANGE,
            "starting_offsets": '{"orders": {"0": 5, "1": -2, "2": -1}}',
            "ending_offsets": '{"orders": {"0": 9, "1": -1}}',
            "max_records_per_trigger": "100",
        }
    )
    assert spark == keyrange
    assert spark.bootstrap == "k:9092"
    assert spark.subscription == Subscription(topics=("orders",))
    assert spark.starting == {
        TopicPartition("orders", 0): 5,
        TopicPartition("orders", 1): EARLIEST,
        TopicPartition("orders", 2): LATEST,
    }
    assert spark.ending == {TopicPartition("orders", 0): 9, TopicPartition("orders", 1): LATEST}
    assert spark.max_records_per_trigger == 100
    # Spark's option map is case-insensitive, and so is this one.
    assert parse_source_options({"KAFKA.BOOTSTRAP.SERVERS": "k:9092", "Subscribe": "orders"})


@pytest.mark.parametrize(
    ("spark_name", "alias", "spark_value", "alias_value"),
    [
        ("kafka.bootstrap.servers", "bootstrap", "a:1", "b:2"),
        ("subscribe", "topics", "orders", "payments"),
        ("startingOffsets", "starting_offsets", "earliest", "latest"),
        ("maxOffsetsPerTrigger", "max_records_per_trigger", "10", "20"),
    ],
)
def test_an_alias_that_disagrees_with_its_spark_name_is_an_error_naming_both(
    spark_name: str, alias: str, spark_value: str, alias_value: str
) -> None:
    options = {**SPARK, spark_name: spark_value, alias: alias_value}
    with pytest.raises(OptionError) as refused:
        parse_source_options(options)
    assert spark_name in str(refused.value) and alias in str(refused.value)
    assert parse_source_options({**SPARK, spark_name: spark_value, alias: spark_value})


def test_exactly_one_of_subscribe_subscribe_pattern_and_assign() -> None:
    bootstrap = {"kafka.bootstrap.servers": "k:9092"}
    assert parse_source_options({**bootstrap, "subscribePattern": "orders-.*"}).subscription == (
        Subscription(pattern="orders-.*")
    )
    assign = parse_source_options({**bootstrap, "assign": '{"a": [1, 0], "b": [2]}'})
    assert assign.subscription.assign == (
        TopicPartition("a", 0),
        TopicPartition("a", 1),
        TopicPartition("b", 2),
    )
    for bad in (
        bootstrap,
        {**SPARK, "subscribePattern": "o.*"},
        {**bootstrap, "assign": '{"a": 0}'},
    ):
        with pytest.raises(OptionError):
            parse_source_options(bad)


def test_patterns_match_whole_topic_names_on_re2() -> None:
    assert matching_topics("orders-.*", ["orders-eu", "orders-us", "old-orders-eu"]) == {
        "orders-eu",
        "orders-us",
    }
    with pytest.raises(InvalidTopicPattern, match=r"RE2"):
        matching_topics(r"(a)\1", ["aa"])


def test_timestamps_rank_above_offsets_as_in_spark() -> None:
    options = parse_source_options(
        {
            **SPARK,
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"orders": {"0": 1700000000000}}',
            "startingOffsetsByTimestampStrategy": "latest",
            "endingTimestamp": "1800000000000",
        }
    )
    assert options.starting == ByTimestamp(
        {TopicPartition("orders", 0): 1700000000000}, when_missing="latest"
    )
    assert options.ending == ByTimestamp(every=1800000000000, when_missing="latest")
    assert parse_source_options({**SPARK, "startingTimestamp": "5"}).starting == ByTimestamp(
        every=5
    )


def test_options_spark_has_and_keyrange_cannot_honour_are_refused_with_a_reason() -> None:
    for name in ("groupIdPrefix", "fetchOffset.numRetries", "kafka.group.id"):
        with pytest.raises(OptionError, match=rf"{name}.*not supported: .+"):
            parse_source_options({**SPARK, name: "x"})
    with pytest.raises(OptionError, match=r"endingOffsets.*cannot be earliest"):
        parse_source_options({**SPARK, "endingOffsets": "earliest"})
    with pytest.raises(OptionError, match=r"maxRecordsPerPartition' needs slice_by=offsets"):
        parse_source_options({**SPARK, "maxRecordsPerPartition": "5", "slice_by": "keys"})
    with pytest.raises(OptionError, match=r"minOffsetsPerTrigger.*maxOffsetsPerTrigger"):
        parse_source_options({**SPARK, "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"})


def test_fail_on_data_loss_maps_onto_the_reset_rules() -> None:
    assert parse_source_options(SPARK).outside_log_reset == "earliest"
    strict = parse_source_options({**SPARK, "failOnDataLoss": "true"})
    assert (strict.outside_log_reset, strict.auto_offset_reset) == ("none", "earliest")
    assert "failOnDataLoss" in strict.outside_log_rule
    lenient = parse_source_options({**SPARK, "failOnDataLoss": "false"})
    assert lenient.outside_log_reset == "earliest"
    with pytest.raises(OptionError, match=r"failOnDataLoss.*auto_offset_reset"):
        parse_source_options({**SPARK, "failOnDataLoss": "false", "auto_offset_reset": "none"})


def test_trigger_and_partition_options() -> None:
    options = parse_source_options(
        {
            **SPARK,
            "minOffsetsPerTrigger": "50",
            "maxTriggerDelay": "30s",
            "minPartitions": "10",
            "includeHeaders": "true",
            "kafkaConsumer.pollTimeoutMs": "5000",
        }
    )
    assert options.min_records_per_trigger == 50
    assert options.max_trigger_delay_s == 30.0
    assert options.include_headers and options.poll_timeout_s == 5.0
    assert parse_source_options(SPARK).max_trigger_delay_s == 900.0
    # minPartitions shares its count by size, as Spark splits offset ranges.
    assert [slices_for(size, 1000, options) for size in (800, 150, 50)] == [8, 2, 1]
    capped = parse_source_options({**SPARK, "maxRecordsPerPartition": "30"})
    assert slices_for(100, 100, capped) == 4


def test_kafka_security_by_kafka_names_becomes_the_sdk_security_model() -> None:
    settings = parse_kafka_settings(
        {
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
            'required username="etl" password="s3;cr\\"et";',
            "kafka.fetch.max.bytes": "1048576",
            "kafka.isolation.level": "read_committed",
        },
        "consumer",
    )
    assert settings.security == KafkaSecurity(
        protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="etl",
        sasl_password='s3;cr"et',
    )
    assert settings.arguments == {"fetch_max_bytes": 1048576, "isolation_level": "read_committed"}
    assert settings.read_committed
    assert "s3;cr" not in repr(settings)
    # The aiokafka names the source took before still work, and agree.
    legacy = parse_kafka_settings(
        {
            "kafka.security_protocol": "SASL_PLAINTEXT",
            "kafka.sasl_mechanism": "PLAIN",
            "kafka.sasl_plain_username": "etl",
            "kafka.sasl_plain_password": "123",
            "kafka.request_timeout_ms": "5000",
        },
        "consumer",
    )
    assert (legacy.security.sasl_username, legacy.security.sasl_password) == ("etl", "123")
    assert legacy.arguments == {"request_timeout_ms": 5000}


def test_pem_stores_are_read_and_other_stores_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "ca.pem")
    with pytest.raises(OptionError, match=r"ssl.truststore.type JKS.*PEM"):
        parse_source_options(
            {**SPARK, "kafka.security.protocol": "SSL", "kafka.ssl.truststore.location": missing}
        )
    with pytest.raises(OptionError, match=r"kafka.ssl.truststore.location .* not a readable file"):
        parse_source_options(
            {
                **SPARK,
                "kafka.security.protocol": "SSL",
                "kafka.ssl.truststore.location": missing,
                "kafka.ssl.truststore.type": "PEM",
            }
        )


def test_unknown_and_conflicting_kafka_settings_are_refused() -> None:
    with pytest.raises(OptionError) as unknown:
        parse_source_options({**SPARK, "kafka.fetch.maxbytes": "1"})
    message = str(unknown.value)
    assert "kafka.fetch.maxbytes" in message
    assert all(f"kafka.{known}" in message for known in known_settings("consumer"))
    with pytest.raises(OptionError, match=r"kafka.request.timeout.ms.*kafka.request_timeout_ms"):
        parse_source_options(
            {**SPARK, "kafka.request.timeout.ms": "1000", "kafka.request_timeout_ms": "2000"}
        )
    with pytest.raises(OptionError, match=r"auto.offset.reset.*startingOffsets"):
        parse_source_options({**SPARK, "kafka.auto.offset.reset": "earliest"})
    with pytest.raises(OptionError, match=r"needs kafka.sasl.mechanism"):
        parse_source_options({**SPARK, "kafka.security.protocol": "SASL_SSL"})
    with pytest.raises(OptionError, match=r"login module .* is not supported"):
        parse_source_options(
            {
                **SPARK,
                "kafka.security.protocol": "SASL_PLAINTEXT",
                "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required;",
            }
        )


def test_the_sink_takes_kafka_names_too() -> None:
    sink = parse_sink_options(
        {"kafka.bootstrap.servers": "k:9092", "topic": "out", "kafka.linger.ms": "5"}
    )
    assert (sink.bootstrap, sink.kafka.arguments) == ("k:9092", {"linger_ms": 5})
    with pytest.raises(OptionError, match=r"acks=all"):
        parse_sink_options({"bootstrap": "k:9092", "topic": "out", "kafka.acks": "1"})


def test_jaas_lines_are_read_the_kafka_way() -> None:
    assert parse_jaas_config(
        "org.apache.kafka.common.security.plain.PlainLoginModule required\n"
        '  username="a b" password=plain;'
    ) == (
        "org.apache.kafka.common.security.plain.PlainLoginModule",
        {"username": "a b", "password": "plain"},
    )


def test_min_offsets_per_trigger_waits_for_records_or_for_the_delay() -> None:
    from client.spark.planning import Position
    from client.spark.source import KeyrangeStreamReader

    tp = TopicPartition("orders", 0)
    options = parse_source_options(
        {**SPARK, "minOffsetsPerTrigger": "10", "maxTriggerDelay": "0ms"}
    )
    assert KeyrangeStreamReader(options)._enough_waiting({tp: Position(0, 5)}, {tp: 9})
    patient = parse_source_options({**SPARK, "minOffsetsPerTrigger": "10"})
    reader = KeyrangeStreamReader(patient)
    assert not reader._enough_waiting({tp: Position(0, 5)}, {tp: 9})
    assert reader._enough_waiting({tp: Position(0, 5)}, {tp: 15})
