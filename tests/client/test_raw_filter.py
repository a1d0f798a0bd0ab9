"""The raw filter against aiokafka's own reading of the same fetch answers, record by record.

aiokafka's ``PartitionRecords`` is the oracle: for any fetch answer (plain and compressed
batches, transactional batches, commit and abort markers, aborted transactions under
``read_committed``, empty batches, headers, log-append timestamps, a fetch offset inside a
batch), the records the raw filter keeps must be exactly the ones aiokafka builds whose key
hash and offset lie in the bounds, equal field by field, and the position after the answer
must be aiokafka's. The C path and the pure-Python path are both held to it. Batches are
written with aiokafka's own builders; control batches and log-append time are set in the
header with the checksum recomputed, as a broker writes them.
"""

from __future__ import annotations

import dataclasses
import gc
import struct
from typing import Any

import pytest
from aiokafka.codec import has_lz4, has_snappy, has_zstd
from aiokafka.consumer.fetcher import READ_COMMITTED, READ_UNCOMMITTED, PartitionRecords
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from client import raw_filter
from client.protocol.committed import CommittedOffsets
from client.protocol.keyspace import HASH_MAX, HASH_MIN, KeyRange, key_hash
from client.raw_filter import FilteredRecords, Judged, RawFilter, RawRecords
from client.tracker import SliceProgress

TP = TopicPartition("topic", 3)
_CONTROL = 0x20
_LOG_APPEND_TIME = 0x08
# Codecs whose library is installed here; gzip always is (the standard library).
CODECS = [0, 1] + [code for code, has in ((2, has_snappy), (3, has_lz4), (4, has_zstd)) if has()]

keys = st.one_of(st.none(), st.binary(max_size=24))
values = st.one_of(st.none(), st.binary(max_size=16))
header_lists = st.lists(
    st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=6))), max_size=3
)
hashes = st.integers(min_value=HASH_MIN, max_value=HASH_MAX)


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]
    compression: int = 0
    producer_id: int = -1
    control: int | None = None  # 0 abort marker, 1 commit marker
    log_append_time: bool = False


def build(spec: BatchSpec, base_offset: int) -> bytes:
    transactional = spec.producer_id >= 0
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=spec.compression,
        is_transactional=int(transactional),
        producer_id=spec.producer_id,
        producer_epoch=0 if transactional else -1,
        base_sequence=0 if transactional else -1,
        batch_size=1 << 30,
    )
    records = spec.records
    if spec.control is not None:
        records = [(struct.pack(">hh", 0, spec.control), struct.pack(">hi", 0, 5), [])]
    for delta, (key, value, headers) in enumerate(records):
        builder.append(
            delta, timestamp=1_700_000_000_000 + 7 * delta, key=key, value=value, headers=headers
        )
    raw = bytearray(builder.build())
    raw[0:8] = base_offset.to_bytes(8, "big")
    attributes = int.from_bytes(raw[21:23], "big")
    if spec.control is not None:
        attributes |= _CONTROL
    if spec.log_append_time:
        attributes |= _LOG_APPEND_TIME
        raw[35:43] = (1_800_000_000_000).to_bytes(8, "big")
    raw[21:23] = attributes.to_bytes(2, "big")
    raw[17:21] = calc_crc32c(bytes(raw[21:])).to_bytes(4, "big")
    return bytes(raw)


def answer(specs: list[BatchSpec], first_offset: int) -> tuple[bytes, list[int]]:
    """A fetch answer's record bytes, and each batch's base offset."""
    data = bytearray()
    bases = []
    offset = first_offset
    for spec in specs:
        bases.append(offset)
        data += build(spec, offset)
        offset += max(len(spec.records), 1) if spec.control is None else 1
    return bytes(data), bases


def oracle(
    data: bytes,
    aborted: list[tuple[int, int]],
    fetch_offset: int,
    isolation: int,
    bounds: list[tuple[int, int, int]],
) -> tuple[list[Any], int]:
    records = PartitionRecords(
        TP, MemoryRecords(data), list(aborted), fetch_offset, None, None, True, isolation
    )
    built = list(records)
    kept = [
        record
        for record in built
        if any(
            start <= key_hash(record.key, record.offset) <= end and record.offset >= first
            for start, end, first in bounds
        )
    ]
    return kept, records.next_fetch_offset


def filtered(
    data: bytes,
    aborted: list[tuple[int, int]],
    fetch_offset: int,
    isolation: int,
    bounds: list[tuple[int, int, int]],
    in_c: bool,
    **deserializers: Any,
) -> tuple[list[Judged], int]:
    judge = RawFilter(
        lambda tp: bounds,
        key_deserializer=deserializers.get("key"),
        value_deserializer=deserializers.get("value"),
        in_c=in_c,
    )
    records = FilteredRecords(
        judge, TP, RawRecords(data), list(aborted), fetch_offset, None, None, True, isolation
    )
    return list(records), records.next_fetch_offset


@st.composite
def fetches(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int]], int, int, list]:
    specs = []
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        kind = draw(st.sampled_from(["data", "data", "transactional", "abort", "commit"]))
        producer_id = draw(st.sampled_from([1, 2])) if kind != "data" else -1
        specs.append(
            BatchSpec(
                records=draw(st.lists(st.tuples(keys, values, header_lists), max_size=12)),
                # Brokers write markers uncompressed (aiokafka reads a compressed one wrongly).
                compression=0 if kind in ("abort", "commit") else draw(st.sampled_from(CODECS)),
                producer_id=producer_id,
                control={"abort": 0, "commit": 1}.get(kind),
                log_append_time=draw(st.booleans()),
            )
        )
    first = draw(st.integers(min_value=0, max_value=2**40))
    data, bases = answer(specs, first)
    aborted = [
        (spec.producer_id, base)
        for spec, base in zip(specs, bases, strict=True)
        if spec.producer_id >= 0 and spec.control is None and draw(st.booleans())
    ]
    last = bases[-1] + max(len(specs[-1].records), 1)
    fetch_offset = draw(st.integers(min_value=first, max_value=last))
    isolation = draw(st.sampled_from([READ_COMMITTED, READ_UNCOMMITTED]))
    own = [
        key_hash(key, base + delta)
        for spec, base in zip(specs, bases, strict=True)
        for delta, (key, _, _) in enumerate(spec.records)
    ]
    ends = st.one_of(hashes, st.sampled_from(own)) if own else hashes
    starts = st.integers(min_value=first, max_value=last + 1)
    bounds = draw(
        st.lists(
            st.tuples(ends, ends, starts).map(lambda t: (*sorted(t[:2]), t[2])),
            min_size=0,
            max_size=3,
        )
    )
    if draw(st.booleans()):
        bounds = [(HASH_MIN, HASH_MAX, 0)]
    return data, aborted, fetch_offset, isolation, bounds


@pytest.mark.parametrize(
    ("in_c", "fields"),
    [(True, raw_filter._FIELDS), (True, None), (False, None)],
    ids=["c", "c-calling-the-class", "python"],
)
@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=fetches())
def test_the_filter_keeps_exactly_what_aiokafka_builds_within_the_bounds(
    in_c: bool, fields: tuple[str, ...] | None, case: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, aborted, fetch_offset, isolation, bounds = case
    expected, expected_position = oracle(data, aborted, fetch_offset, isolation, bounds)
    with monkeypatch.context() as patched:
        patched.setattr(raw_filter, "_FIELDS", fields)
        judged, position = filtered(data, aborted, fetch_offset, isolation, bounds, in_c)
    assert [record for batch in judged for record in batch.records] == expected
    assert [offset for batch in judged for offset in batch.offsets] == [
        record.offset for record in expected
    ]
    assert [hashed for batch in judged for hashed in batch.hashes] == [
        key_hash(record.key, record.offset) for record in expected
    ]
    assert position == expected_position
    if judged:
        assert judged[-1].next_offset == expected_position


def test_the_c_path_is_taken_when_the_extension_is_built() -> None:
    assert raw_filter.native_available()
    assert raw_filter._FIELDS is not None  # kept records are built without a Python call
    assert RawFilter(lambda tp: [], key_deserializer=None, value_deserializer=None).in_c


@pytest.mark.parametrize("in_c", [True, False], ids=["c", "python"])
def test_deserializers_see_only_non_null_fields_of_records_kept(in_c: bool) -> None:
    seen: list[bytes] = []

    def key_decode(raw: bytes) -> str:
        seen.append(raw)
        return raw.decode()

    records = [(b"a", b"1", []), (None, b"2", []), (b"c", None, [("h", None)])]
    data, _ = answer([BatchSpec(records, compression=1)], 10)
    judged, _ = filtered(
        data, [], 10, READ_UNCOMMITTED, [(HASH_MIN, HASH_MAX, 0)], in_c, key=key_decode, value=int
    )
    got = judged[0].records
    assert [(r.key, r.value, r.serialized_key_size, r.serialized_value_size) for r in got] == [
        ("a", 1, 1, 1),
        (None, 2, -1, 1),
        ("c", None, 1, -1),
    ]
    assert got[2].headers == (("h", None),)
    assert seen == [b"a", b"c"]


def test_records_of_atomic_fields_are_left_out_of_the_cycle_collector() -> None:
    """The C scan untracks a kept record whose fields cannot refer back to it; a record whose
    key or value a deserializer made a container stays tracked."""
    records = [(b"a", b"1", [("h", b"x"), ("i", None)]), (b"b", b"2", [])]
    data, _ = answer([BatchSpec(records)], 10)
    everything = [(HASH_MIN, HASH_MAX, 0)]
    plain = filtered(data, [], 10, READ_UNCOMMITTED, everything, in_c=True)[0][0].records
    assert [gc.is_tracked(record) for record in plain] == [False, False]
    assert not gc.is_tracked(plain[0].headers)
    assert not any(gc.is_tracked(pair) for pair in plain[0].headers)
    assert plain[0].headers == (("h", b"x"), ("i", None))

    as_lists = filtered(data, [], 10, READ_UNCOMMITTED, everything, in_c=True, value=list)[0][0]
    assert [gc.is_tracked(record) for record in as_lists.records] == [True, True]
    assert as_lists.records[0].value == [ord("1")]


def test_legacy_batches_are_judged_in_python_like_aiokafka() -> None:
    data = bytearray()
    for offset, key in enumerate([b"x", None, b"z"]):
        builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
        builder.append(0, timestamp=1_700_000_000_000, key=key, value=b"v")
        raw = bytearray(builder.build())
        raw[0:8] = offset.to_bytes(8, "big")
        data += raw
    bounds = [(HASH_MIN, HASH_MAX, 1)]
    expected, position = oracle(bytes(data), [], 0, READ_UNCOMMITTED, bounds)
    judged, ours = filtered(bytes(data), [], 0, READ_UNCOMMITTED, bounds, in_c=True)
    assert [record for batch in judged for record in batch.records] == expected
    assert len(expected) == 2
    assert ours == position


@pytest.mark.parametrize("in_c", [True, False], ids=["c", "python"])
def test_a_corrupt_batch_raises_aiokafkas_error(in_c: bool) -> None:
    data, _ = answer([BatchSpec([(b"k", b"v", [])] * 3)], 0)
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptRecordException):
        filtered(bytes(damaged), [], 0, READ_UNCOMMITTED, [(HASH_MIN, HASH_MAX, 0)], in_c)


def test_a_malformed_batch_with_a_valid_checksum_raises_instead_of_reading_past_it() -> None:
    data, _ = answer([BatchSpec([(b"k", b"v", [("h", b"x")])] * 3)], 0)
    damaged = bytearray(data)
    damaged[61] = 0x7F  # the first record's length, far past the batch's end
    damaged[17:21] = calc_crc32c(bytes(damaged[21:])).to_bytes(4, "big")
    with pytest.raises(CorruptRecordException, match=r"malformed record batch.*topic\[3\]"):
        filtered(bytes(damaged), [], 0, READ_UNCOMMITTED, [(HASH_MIN, HASH_MAX, 0)], True)


def test_more_bounds_than_the_c_reader_takes_are_judged_in_python() -> None:
    data, _ = answer([BatchSpec([(b"key-%d" % i, b"v", []) for i in range(50)])], 0)
    many = [(index * 4, index * 4 + 1, 0) for index in range(2000)] + [(2**62, HASH_MAX, 0)]
    expected, _ = oracle(data, [], 0, READ_UNCOMMITTED, many)
    judged, _ = filtered(data, [], 0, READ_UNCOMMITTED, many, in_c=True)
    assert judged[0].records == expected


@pytest.mark.parametrize("in_c", [True, False], ids=["c", "python"])
def test_a_deserializer_error_reaches_the_caller_as_it_is(in_c: bool) -> None:
    def refuse(raw: bytes) -> None:
        raise ValueError("not mine")

    data, _ = answer([BatchSpec([(b"k", b"v", [])])], 0)
    with pytest.raises(ValueError, match="not mine"):
        filtered(data, [], 0, READ_UNCOMMITTED, [(HASH_MIN, HASH_MAX, 0)], in_c, value=refuse)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_slices_bounds_keep_exactly_what_its_committed_state_leaves_unprocessed(
    data: st.DataObject,
) -> None:
    """Without IC ranges the raw filter's bounds are the committed state's answer itself:
    a record is judged again iff it lies at or past the slice's position and is not
    processed; so the C filter never drops what the tracker would accept."""
    stable = data.draw(st.integers(min_value=0, max_value=50))
    cuts = sorted(set(data.draw(st.lists(hashes, max_size=8))))
    pieces = tuple(
        (low, high, data.draw(st.integers(min_value=stable + 1, max_value=stable + 60)))
        for low, high in zip(cuts[::2], cuts[1::2], strict=False)
    )
    try:
        committed = CommittedOffsets.of_pieces(stable, (), pieces)
    except ValueError:  # adjacent pieces drawn with the same offset
        assume(False)
    keys = KeyRange(*sorted(data.draw(st.tuples(hashes, hashes))))
    position = data.draw(st.integers(min_value=0, max_value=80))
    bounds = SliceProgress(keys, position, committed).bounds()
    edges = {keys.start, keys.end} | {edge + step for edge in cuts for step in (-1, 0, 1)}
    probes = [h for h in edges if keys.start <= h <= keys.end] + data.draw(
        st.lists(st.integers(min_value=keys.start, max_value=keys.end), max_size=5)
    )
    for hashed in probes:
        for offset in range(0, 130, 3):
            inside = any(s <= hashed <= e and offset >= first for s, e, first in bounds)
            wanted = offset >= position and not committed.is_processed(offset, hashed)
            assert inside == wanted, (hashed, offset)
