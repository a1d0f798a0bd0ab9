"""Store engines (one suite over memory and RocksDB), checkpoints, and restoration of a key
range from a real changelog: only the range's records are written, every record is read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from client.protocol.keyspace import KeyRange, key_hash
from client.streams import INT64, STRING, StoreSpec, restore
from client.streams.checkpoint import read_checkpoint, start_offset, write_checkpoint
from client.streams.internal import for_application
from client.streams.restore import RestoreProgress, Restorer
from client.streams.state import StateManager
from client.streams.stores import BytesStore, MemoryStore, RocksStore, delete_ranges
from tests.fixtures.services import MakeTopic
from tests.streams.harness import count_topology, produce


@pytest.fixture(params=["native", "python"])
def judge(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a restore judges keys: the C reader, and the Python loop an install without
    a C compiler uses (and the C reader hands compressed batches to)."""
    if request.param == "python":
        monkeypatch.setattr(restore, "_native", None)
    return str(request.param)


@pytest.fixture(params=["memory", "rocksdb"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BytesStore]:
    store: BytesStore = MemoryStore() if request.param == "memory" else RocksStore(tmp_path / "db")
    yield store
    store.close()


def test_put_get_delete_and_range_scans_in_key_byte_order(engine: BytesStore) -> None:
    for key in [b"c", b"a", b"e", b"b", b"d"]:
        engine.put(key, key.upper())
    engine.delete(b"e")
    assert engine.get(b"a") == b"A" and engine.get(b"e") is None
    assert list(engine.scan(b"b", b"d")) == [(b"b", b"B"), (b"c", b"C"), (b"d", b"D")]
    assert [key for key, _ in engine.scan()] == [b"a", b"b", b"c", b"d"]


def test_a_batch_of_changes_applies_in_order(engine: BytesStore) -> None:
    engine.put(b"old", b"1")
    engine.apply(
        [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"b", None), (b"old", None), (b"gone", None)]
    )
    assert list(engine.scan()) == [(b"a", b"3")]
    engine.apply([])
    assert list(engine.scan()) == [(b"a", b"3")]


def test_deleting_a_key_range_removes_exactly_its_keys(engine: BytesStore) -> None:
    keys = [b"key-%d" % index for index in range(200)]
    for key in keys:
        engine.put(key, b"v")
    lower_half = KeyRange(0, 2**62 - 1)
    deleted = delete_ranges(engine, [lower_half])
    remaining = [key for key, _ in engine.scan()]
    assert deleted + len(remaining) == len(keys)
    assert all(not lower_half.contains(key_hash(key, 0)) for key in remaining)


def test_rocksdb_keeps_its_data_across_a_reopen(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db")
    store.put(b"k", b"v")
    store.flush()
    store.close()
    reopened = RocksStore(tmp_path / "db")
    assert reopened.get(b"k") == b"v"
    reopened.close()


def test_a_checkpoint_covers_the_ranges_it_lists(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    assert read_checkpoint(path) == {}
    write_checkpoint(path, {KeyRange(0, 99): 42, KeyRange(200, 299): 7})
    loaded = read_checkpoint(path)
    assert start_offset(loaded, KeyRange(10, 20)) == 42
    assert start_offset(loaded, KeyRange(90, 210)) is None
    path.write_text("not json")
    assert read_checkpoint(path) == {}


async def test_restoring_a_quarter_of_the_keys_reads_all_and_writes_only_them(
    kafka_bootstrap: str, make_topic: MakeTopic, engine: BytesStore, judge: str
) -> None:
    changelog = await make_topic(1, config={"cleanup.policy": "compact"})
    keys = [b"user-%d" % index for index in range(400)]
    quarter = KeyRange.full().split(4)[1]
    mine = {key for key in keys if quarter.contains(key_hash(key, 0))}
    # A tombstone for a key of the quarter: restored in the same batch as the key's value,
    # it must leave the key deleted.
    doomed = min(mine)
    await produce(kafka_bootstrap, changelog, [(key, b"value", None) for key in keys])
    await produce(kafka_bootstrap, changelog, [(doomed, None, None)])
    restorer = Restorer({"bootstrap_servers": kafka_bootstrap})
    await restorer.start()
    try:
        progress = await restorer.restore(changelog, RestoreProgress("s", 0, [quarter], 0), engine)
        assert progress.read == len(keys) + 1
        assert progress.restored == len(mine) + 1
        assert {key for key, _ in engine.scan()} == mine - {doomed}
        assert progress.end_offset == progress.position == len(keys) + 1
        # From a checkpoint, only the tail is read.
        tail = await restorer.restore(
            changelog, RestoreProgress("s", 0, [quarter], len(keys)), MemoryStore()
        )
        assert tail.read == 1
        empty = await make_topic(1)
        nothing = await restorer.restore(empty, RestoreProgress("s", 0, [quarter], 0), engine)
        assert nothing.read == 0 and nothing.done
    finally:
        await restorer.stop()


async def test_a_restore_across_many_fetches_and_from_inside_a_record_batch(
    kafka_bootstrap: str, make_topic: MakeTopic, judge: str
) -> None:
    changelog = await make_topic(1, config={"cleanup.policy": "compact"})
    keys = [b"user-%d" % index for index in range(400)]
    # Eight record batches of 50; fetches of one byte answer one batch each.
    for first in range(0, len(keys), 50):
        await produce(
            kafka_bootstrap, changelog, [(key, b"value", None) for key in keys[first : first + 50]]
        )
    quarter = KeyRange.full().split(4)[1]
    restorer = Restorer({"bootstrap_servers": kafka_bootstrap}, partition_fetch_bytes=1)
    await restorer.start()
    try:
        fetches: list[int] = []
        whole = MemoryStore()
        progress = await restorer.restore(
            changelog,
            RestoreProgress("s", 0, [KeyRange.full()], 25),
            whole,
            lambda seen: fetches.append(seen.position),
        )
        assert progress.read == progress.restored == len(keys) - 25
        assert {key for key, _ in whole.scan()} == set(keys[25:])
        assert progress.position == progress.end_offset == len(keys)
        assert len(fetches) > 2
        mine = MemoryStore()
        part = await restorer.restore(changelog, RestoreProgress("s", 0, [quarter], 0), mine)
        assert part.read == len(keys)
        assert {key for key, _ in mine.scan()} == {
            key for key in keys if quarter.contains(key_hash(key, 0))
        }
    finally:
        await restorer.stop()


def test_checkpointed_pieces_covering_a_range_restore_it_from_their_lowest_offset() -> None:
    pieces = {KeyRange(0, 9): 50, KeyRange(10, 20): 42, KeyRange(30, 40): 7}
    assert start_offset(pieces, KeyRange(5, 15)) == 42
    assert start_offset(pieces, KeyRange(0, 20)) == 42
    # A gap (21..29) is not covered: read from the start.
    assert start_offset(pieces, KeyRange(15, 35)) is None


def test_a_standby_checkpoints_where_its_reading_reached_and_a_restore_reads_on_from_it(
    tmp_path: Path,
) -> None:
    topology = count_topology("words", "counts").add_state_store(
        StoreSpec("persisted", STRING, INT64, persistent=True), "count"
    )
    state = StateManager(for_application(topology.build(), "app"), tmp_path)
    own, standby = KeyRange.full().split(2)
    state.restored("persisted", 0, own, 10)
    state.standby_at("persisted", 0, standby, 7)
    # This process wrote up to offset 40 for its own keys: the standby's keys are another
    # instance's, so its offset stays where its reading reached.
    state.note_written("app-persisted-changelog", 0, 40)
    state.write_checkpoints("app")
    written = read_checkpoint(tmp_path / "persisted" / "partition-0" / "checkpoint")
    assert written == {own: 41, standby: 7}
    # Given the standby's range, the restore starts at the standby's offset; the whole
    # partition (its own range grown over it) at the lowest of the two.
    assert state.restore_from("persisted", 0, standby) == 7
    assert state.restore_from("persisted", 0, KeyRange.full()) == 7
    state.restored("persisted", 0, standby, 12)
    assert state.standby_offset("persisted", 0, standby) is None
