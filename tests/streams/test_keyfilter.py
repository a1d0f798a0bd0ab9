"""The restore's key-range judgement, native and in Python, against the keyspace's rule.

Both paths of ``client.streams.restore`` must keep exactly the records whose ``key_hash``
falls in the task's ranges, from the restore's position on: batches are built here with
aiokafka's own writer, so the C reader is checked against the format as Kafka clients write
it, and damaged batches must raise, never crash the process or read past the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.structs import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.protocol import _keyfilter
from client.protocol.keyspace import HASH_MAX, HASH_MIN, KeyRange, key_hash
from client.streams import restore
from client.streams.errors import StreamsError
from client.streams.restore import RestoreProgress

_GZIP = 1
_TP = TopicPartition("changelog", 0)

keys = st.one_of(st.none(), st.binary(max_size=40))
values = st.one_of(st.none(), st.binary(max_size=20))
hashes = st.integers(min_value=HASH_MIN, max_value=HASH_MAX)


def build_batch(
    records: list[tuple[bytes | None, bytes | None]],
    base_offset: int = 0,
    compression: int = 0,
    headers: list[tuple[str, bytes]] | None = None,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for delta, (key, value) in enumerate(records):
        builder.append(
            delta, timestamp=1_700_000_000_000 + delta, key=key, value=value, headers=headers or []
        )
    raw = bytearray(builder.build())
    raw[0:8] = base_offset.to_bytes(8, "big")
    return bytes(raw)


def expected(
    records: list[tuple[bytes | None, bytes | None]],
    base_offset: int,
    position: int,
    ranges: list[tuple[int, int]],
) -> tuple[int, list[tuple[bytes | None, bytes | None]]]:
    kept = []
    read = 0
    for delta, (key, value) in enumerate(records):
        offset = base_offset + delta
        if offset < position:
            continue
        read += 1
        hashed = key_hash(key, offset)
        if any(start <= hashed <= end for start, end in ranges):
            kept.append((key, value))
    return read, kept


@dataclass
class ListStore:
    """Records what a restore applies, in order (the engines are tested in test_stores)."""

    changes: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)

    def apply(self, changes: list[tuple[bytes | None, bytes | None]]) -> None:
        self.changes.extend(changes)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[tuple[bytes | None, bytes | None]], int, int, list]:
    records = draw(st.lists(st.tuples(keys, values), min_size=1, max_size=40))
    base_offset = draw(st.integers(min_value=0, max_value=2**40))
    position = base_offset + draw(st.integers(min_value=0, max_value=len(records)))
    # Range ends drawn from the records' own hashes too, so the edges of a range are hit.
    own = [key_hash(key, base_offset + delta) for delta, (key, _) in enumerate(records)]
    after = st.sampled_from(own).map(lambda hashed: min(hashed + 1, HASH_MAX))
    ends = st.one_of(hashes, st.sampled_from(own), after)
    ranges = draw(st.lists(st.tuples(ends, ends).map(sorted).map(tuple), min_size=1, max_size=3))
    return records, base_offset, position, ranges


@pytest.mark.parametrize("path", ["native", "python"])
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=cases())
def test_a_restore_keeps_exactly_the_records_whose_key_hash_is_in_its_ranges(
    path: str, case: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, base_offset, position, ranges = case
    raw = build_batch(records, base_offset)
    batch = DefaultRecordBatch(raw)
    assert batch.validate_crc()
    with monkeypatch.context() as patched:
        if path == "python":
            patched.setattr(restore, "_native", None)
        progress = RestoreProgress("s", 0, [KeyRange(*pair) for pair in ranges], position)
        progress.position = position
        store = ListStore()
        restore._restore_batch(restore._Batch(memoryview(raw), batch), progress, ranges, store, _TP)
    read, kept = expected(records, base_offset, position, ranges)
    assert progress.read == read
    assert store.changes == kept
    assert progress.restored == len(kept)


@given(key=st.binary(max_size=100))
def test_the_native_hash_is_the_keyspace_hash(key: bytes) -> None:
    assert _keyfilter.key_hash(key) == key_hash(key, 0)


def test_record_headers_are_skipped_and_values_kept_whole() -> None:
    records = [(b"key-%d" % index, b"v" * index) for index in range(300)]
    raw = build_batch(records, headers=[("trace", b"x" * 50)])
    read, selected_keys, selected_values = _keyfilter.select(raw, 0, [(HASH_MIN, HASH_MAX)])
    assert read == 300
    assert list(zip(selected_keys, selected_values, strict=True)) == records


def test_a_batch_the_native_reader_does_not_read_goes_to_the_python_path() -> None:
    records = [(b"key-%d" % index, b"value") for index in range(50)]
    compressed = build_batch(records, compression=_GZIP)
    assert _keyfilter.select(compressed, 0, [(HASH_MIN, HASH_MAX)]) is None
    progress = RestoreProgress("s", 0, [KeyRange.full()], 0)
    store = ListStore()
    batch = restore._Batch(memoryview(compressed), DefaultRecordBatch(compressed))
    restore._restore_batch(batch, progress, [(HASH_MIN, HASH_MAX)], store, _TP)
    assert store.changes == records
    assert progress.read == 50


def test_a_task_with_more_ranges_than_the_native_reader_takes_is_judged_in_python() -> None:
    raw = build_batch([(b"a", b"1")])
    many = [(index * 4, index * 4 + 1) for index in range(2000)]
    assert _keyfilter.select(raw, 0, many) is None


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_damaged_batch_raises_instead_of_reading_past_its_bytes(data: st.DataObject) -> None:
    records = data.draw(st.lists(st.tuples(keys, values), min_size=1, max_size=10))
    raw = bytearray(build_batch(records))
    # Damage the records, not the header's length: a batch whose length is wrong is refused
    # before its records are read (tested below).
    cut = data.draw(st.integers(min_value=61, max_value=len(raw)))
    damage = data.draw(st.binary(min_size=1, max_size=8))
    damaged = raw[:cut] + damage + raw[cut + len(damage) :]
    damaged = damaged[: len(raw)]
    try:
        result = _keyfilter.select(bytes(damaged), 0, [(HASH_MIN, HASH_MAX)])
    except ValueError as err:
        assert "malformed record batch" in str(err)
    else:
        assert result is not None
        assert result[0] <= len(records)


def test_a_truncated_batch_is_refused_and_the_restore_names_the_changelog() -> None:
    raw = build_batch([(b"key", b"value")] * 5)
    with pytest.raises(ValueError, match="batch length"):
        _keyfilter.select(raw[:-1], 0, [(HASH_MIN, HASH_MAX)])
    progress = RestoreProgress("s", 0, [KeyRange.full()], 0)
    batch = restore._Batch(memoryview(raw[:-1]), DefaultRecordBatch(raw))
    with pytest.raises(StreamsError, match=r"changelog\[0\].*malformed record batch"):
        restore._restore_batch(batch, progress, [(HASH_MIN, HASH_MAX)], ListStore(), _TP)


def test_an_offset_past_the_largest_is_refused() -> None:
    raw = build_batch([(b"key", b"value")] * 3, base_offset=2**63 - 2)
    with pytest.raises(ValueError, match="offset delta"):
        _keyfilter.select(raw, 0, [(HASH_MIN, HASH_MAX)])
