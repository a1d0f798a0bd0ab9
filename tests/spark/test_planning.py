"""Pure planning: slices, admission control, stream offsets, and what a finished batch reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition

from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import HASH_MAX, KeyRange
from client.spark.kafka_settings import kafka_arguments
from client.spark.options import OptionError, parse_source_options
from client.spark.planning import (
    PartitionSpan,
    Position,
    admit,
    advance,
    plan_commits,
    plan_slices,
    positions_of,
    spans_between,
    split_offsets,
    stream_offset,
    trim_committed,
)

TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)
LOWER = KeyRange(0, 2**62 - 1)
UPPER = KeyRange(2**62, HASH_MAX)


def test_offset_split_is_contiguous_and_even_and_never_empty() -> None:
    assert split_offsets(10, 20, 3) == [(10, 14), (14, 17), (17, 20)]
    assert split_offsets(10, 12, 4) == [(10, 11), (11, 12)]
    assert split_offsets(10, 10, 4) == []


def test_offset_slices_cover_the_span_with_the_full_key_range() -> None:
    slices = plan_slices([PartitionSpan("orders", 0, 0, 0, 100)], 4, "offsets", {})
    assert [(s.start, s.end) for s in slices] == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert {s.keys for s in slices} == {KeyRange.full()}
    assert all(s.committed is None for s in slices)


def test_key_slices_each_read_the_span_and_start_at_their_range_watermark() -> None:
    committed = {TP0: CommittedOffsets(10, watermarks=(Watermark(LOWER, 40),))}
    slices = plan_slices([PartitionSpan("orders", 0, 10, 10, 100)], 2, "keys", committed)
    assert [(s.keys, s.start, s.end) for s in slices] == [(LOWER, 40, 100), (UPPER, 10, 100)]


def test_a_slice_wholly_processed_is_not_planned() -> None:
    committed = {TP0: CommittedOffsets(10, watermarks=(Watermark(LOWER, 100),))}
    slices = plan_slices([PartitionSpan("orders", 0, 10, 10, 100)], 2, "keys", committed)
    assert [s.keys for s in slices] == [UPPER]


def test_trimmed_state_keeps_only_what_decides_records_of_the_slice() -> None:
    state = CommittedOffsets(
        5,
        ranges=((7, 8), (20, 30), (90, 95)),
        watermarks=(Watermark(LOWER, 12), Watermark(UPPER, 60)),
    )
    trimmed = trim_committed(state, UPPER, 15, 50)
    assert trimmed.ranges == ((20, 30),)
    assert trimmed.watermarks == (Watermark(UPPER, 60),)
    for offset in range(15, 50):
        assert trimmed.is_processed(offset, 2**62) == state.is_processed(offset, 2**62)


def test_admission_shares_the_limit_by_backlog_and_fills_it() -> None:
    assert admit({TP0: 30, TP1: 10}, 100) == {TP0: 30, TP1: 10}
    assert admit({TP0: 300, TP1: 100}, 100) == {TP0: 75, TP1: 25}
    shares = admit({TP0: 1, TP1: 1, TopicPartition("orders", 2): 1}, 2)
    assert sum(shares.values()) == 2


def test_advance_respects_the_limit_and_keeps_origins() -> None:
    start = {TP0: Position(0, 10), TP1: Position(5, 5)}
    assert advance(start, {TP0: 110, TP1: 105}, 50) == {
        TP0: Position(0, 35),
        TP1: Position(5, 30),
    }
    assert advance(start, {TP0: 110, TP1: 105}, None) == {
        TP0: Position(0, 110),
        TP1: Position(5, 105),
    }


def test_stream_offsets_round_trip_and_spans_cover_only_progress() -> None:
    start = {TP0: Position(0, 10), TP1: Position(5, 5)}
    end = {TP0: Position(0, 30), TP1: Position(5, 5), TopicPartition("new", 0): Position(2, 9)}
    document = stream_offset("g", end)
    assert positions_of(document) == end
    assert document["group"] == "g"
    assert sorted(spans_between(start, end), key=lambda s: s.topic) == [
        PartitionSpan("new", 0, 2, 2, 9),
        PartitionSpan("orders", 0, 0, 10, 30),
    ]


def test_a_position_restarted_past_the_log_end_reads_from_its_new_origin() -> None:
    # The checkpoint was at 2,000; the log now ends at 30 and the reset went to its start,
    # possibly the very origin the query began at.
    start = {TP0: Position(0, 2_000), TP1: Position(1_500, 2_000)}
    end = {TP0: Position(0, 30), TP1: Position(0, 30)}
    assert spans_between(start, end) == [
        PartitionSpan("orders", 0, 0, 0, 30),
        PartitionSpan("orders", 1, 0, 0, 30),
    ]


def test_a_partition_never_committed_reports_one_watermark() -> None:
    [commit] = plan_commits({TP0: Position(50, 80)}, {})
    assert commit.ranges == ()
    assert commit.watermarks == (Watermark(KeyRange.full(), 80),)


def test_a_partition_never_committed_from_an_explicit_origin_reports_only_its_span() -> None:
    [commit] = plan_commits({TP0: Position(50, 80, explicit=True)}, {})
    assert commit.watermarks == ()
    assert commit.ranges == ((50, 79),)


def test_an_explicit_origin_travels_through_offsets_batches_and_spans() -> None:
    start = {TP0: Position(50, 50, explicit=True), TP1: Position(0, 0)}
    end = advance(start, {TP0: 80, TP1: 30}, None)
    assert end == {TP0: Position(50, 80, explicit=True), TP1: Position(0, 30)}
    document = stream_offset("g", end)
    assert document["partitions"]["orders"] == {"0": [50, 80, "explicit"], "1": [0, 30]}
    assert positions_of(document) == end
    assert [span.explicit for span in spans_between(start, end)] == [True, False]


def test_a_span_from_the_stable_offset_reports_one_watermark() -> None:
    [commit] = plan_commits({TP0: Position(50, 80)}, {TP0: CommittedOffsets(50)})
    assert commit.ranges == ()
    assert commit.watermarks == (Watermark(KeyRange.full(), 80),)


def test_a_span_above_part_of_the_watermarks_reports_them_and_an_ic_range() -> None:
    state = CommittedOffsets(10, watermarks=(Watermark(LOWER, 50),))
    [commit] = plan_commits({TP0: Position(50, 80)}, {TP0: state})
    assert commit.watermarks == (Watermark(LOWER, 80),)
    assert commit.ranges == ((50, 79),)


def test_a_span_above_every_watermark_reports_an_ic_range_only() -> None:
    [commit] = plan_commits({TP0: Position(50, 80)}, {TP0: CommittedOffsets(10)})
    assert commit.watermarks == ()
    assert commit.ranges == ((50, 79),)


def test_an_empty_span_reports_nothing() -> None:
    assert plan_commits({TP0: Position(50, 50)}, {}) == []


def test_options_are_checked_on_the_driver() -> None:
    base = {"bootstrap": "localhost:9092", "topics": "a, b,a"}
    assert parse_source_options(base).subscription.topics == ("a", "b")
    assert parse_source_options(base).starting == "earliest"
    with_coordinator = {**base, "coordinator": "http://c", "group": "g"}
    assert parse_source_options(with_coordinator).starting == "committed"
    explicit = parse_source_options({**base, "starting_offsets": '{"a": {"0": 7}}'})
    assert explicit.starting == {TopicPartition("a", 0): 7}
    for bad in (
        {"topics": "a"},
        {**base, "group": "g"},
        {**base, "slice_by": "rows"},
        {**base, "slices_per_partition": "0"},
        {**base, "starting_offsets": "committed"},
        {**base, "ending_offsets": '{"a": {"0": -2}}'},
    ):
        with pytest.raises(OptionError):
            parse_source_options(bad)


def test_importing_the_client_does_not_import_pyspark() -> None:
    probe = "import sys, client; print('pyspark' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert result.stdout.strip() == "False", result.stderr


def test_kafka_options_are_typed_by_name_not_by_value() -> None:
    assert kafka_arguments(
        {
            "request_timeout_ms": "5000",
            "enable_idempotence": "true",
            "sasl_plain_password": "123456",
            "security_protocol": "SASL_SSL",
        }
    ) == {
        "request_timeout_ms": 5000,
        "enable_idempotence": True,
        "sasl_plain_password": "123456",
        "security_protocol": "SASL_SSL",
    }
