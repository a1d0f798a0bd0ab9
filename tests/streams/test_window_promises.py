"""What windows promise whatever the number of instances (issue 46, item 6): retention is
never below what an open window needs, and a store shared by several key ranges never drops
a window one of them still needs."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from client.protocol.keyspace import KeyRange, key_hash
from client.streams import JSON, STRING, StoreSpec
from client.streams.dsl import StreamsBuilder, session, tumbling
from client.streams.window_store import TaskWindowStore, encode_change, open_window_backend
from tests.streams.test_dsl import Offline, windowed_app

MINUTE = 60_000
FULL = KeyRange.full()


def key_in(keys: KeyRange) -> str:
    return next(f"k{n}" for n in range(1000) if keys.contains(key_hash(f"k{n}".encode(), 0)))


def test_a_retention_below_size_plus_grace_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"size_ms 600000 \+ grace_ms 300000") as refused:
        tumbling(10 * MINUTE, grace_ms=5 * MINUTE, retention_ms=5 * MINUTE)
    assert "window size plus the grace period" in str(refused.value)
    with pytest.raises(ValueError, match=r"gap_ms 100 \+ grace_ms 10"):
        session(100, grace_ms=10, retention_ms=100)
    assert tumbling(10 * MINUTE, grace_ms=5 * MINUTE, retention_ms=15 * MINUTE)


def test_the_least_retention_keeps_a_window_open_for_its_grace(tmp_path: Path) -> None:
    # The review's probe: 0, 9:59, 10:00, 9:50 (within grace), 20:00.
    windows = tumbling(10 * MINUTE, grace_ms=5 * MINUTE, retention_ms=15 * MINUTE)
    run = windowed_app(windows, final=True, tmp_path=tmp_path)
    for stamp in (0, 9 * MINUTE + 59_000, 10 * MINUTE, 9 * MINUTE + 50_000, 20 * MINUTE):
        run.send("views", b"k", b"{}", stamp)
    emitted = [json.loads(value or b"") for _, value in run.out["out"]]
    assert emitted == [[0, 10 * MINUTE, 3]]


def test_a_range_joining_after_a_faster_one_keeps_its_restored_windows() -> None:
    # The review's probe (M3): view 1 writes up to end 20 min (retention 2 min), view 2
    # joins and restores a window ending at 5 min.
    retained = StoreSpec("w", STRING, JSON, retention_ms=2 * MINUTE, segment_ms=MINUTE)
    backend = open_window_backend(retained, None)
    low, high = KeyRange(0, FULL.end // 2), KeyRange(FULL.end // 2 + 1, FULL.end)
    fast_key, slow_key = key_in(high), key_in(low)
    fast = TaskWindowStore(retained, backend, [high], lambda k, v: None)
    for minute in range(1, 21):
        fast.put(fast_key, (minute - 1) * MINUTE, minute * MINUTE, minute)
    heir = TaskWindowStore(retained, backend, [low], lambda k, v: None)
    backend.apply([(slow_key.encode(), encode_change(4 * MINUTE, 5 * MINUTE, 0, b"7"))])
    assert backend.get_window(slow_key.encode(), 4 * MINUTE, 5 * MINUTE) == (0, b"7")
    assert heir.get(slow_key, 4 * MINUTE, 5 * MINUTE) == 7
    # The faster range writes on: the heir, still at its restore, holds expiry back.
    fast.put(fast_key, 30 * MINUTE, 31 * MINUTE, 1)
    assert heir.fetch(slow_key) == [(4 * MINUTE, 5 * MINUTE, 7)]
    # The heir's replay brings it past its window's retention: expiry resumes.
    heir.put(slow_key, 30 * MINUTE, 31 * MINUTE, 1)
    fast.put(fast_key, 40 * MINUTE, 41 * MINUTE, 1)
    assert heir.fetch(slow_key) == [(30 * MINUTE, 31 * MINUTE, 1)]


@pytest.mark.parametrize("persistent", [False, True])
def test_tasks_on_threads_and_queries_share_one_backend_safely(
    persistent: bool, tmp_path: Path
) -> None:
    """Two tasks' writes expire segments under a third thread's scans and lookups
    (``processing_threads > 1`` and a query on the loop): nothing fails, every scan answers."""
    interval = sys.getswitchinterval()
    # Threads switch as often as the interpreter allows, so the race shows in one run.
    sys.setswitchinterval(1e-6)
    try:
        hammer(persistent, tmp_path)
    finally:
        sys.setswitchinterval(interval)


def hammer(persistent: bool, tmp_path: Path) -> None:
    spec = StoreSpec("w", STRING, JSON, persistent=persistent, retention_ms=20, segment_ms=10)
    backend = open_window_backend(spec, tmp_path)
    halves = [KeyRange(0, FULL.end // 2), KeyRange(FULL.end // 2 + 1, FULL.end)]
    views = [TaskWindowStore(spec, backend, [keys], lambda k, v: None) for keys in halves]
    failures: list[BaseException] = []
    done = threading.Event()

    def task(view: TaskWindowStore, key: str) -> None:
        try:
            for end in range(1, 3000):
                view.put(key, end - 1, end, end)
        except Exception as failure:
            failures.append(failure)

    def query() -> None:
        try:
            while not done.is_set():
                for view in views:
                    view.fetch_all()
                backend.get_window(b"k", 0, 1)
        except Exception as failure:
            failures.append(failure)

    threads = [
        threading.Thread(target=task, args=(view, key_in(keys)))
        for view, keys in zip(views, halves, strict=True)
    ]
    reader = threading.Thread(target=query)
    reader.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    done.set()
    reader.join(timeout=60)
    assert not failures, failures
    assert [view.fetch_all()[-1][1:3] for view in views] == [(2998, 2999)] * 2
    backend.close()


@pytest.mark.parametrize("final", [True, False])
def test_a_session_record_is_late_by_its_merged_sessions_end(final: bool, tmp_path: Path) -> None:
    # Gap 50, grace 5. a@96, then z@101: stream time 101, records before 96 are old. a@90
    # merges with [96, 96], which ends at 96, not before it: Kafka Streams counts it.
    run = windowed_app(session(50, grace_ms=5), final=final, tmp_path=tmp_path)
    for key, stamp in [("a", 96), ("z", 101), ("a", 90), ("a", 20), ("z", 1000)]:
        run.send("views", key.encode(), b"{}", stamp)
    rows = [(k.decode(), *json.loads(v)) for k, v in run.out["out"] if v is not None]
    latest = {(key, start, end): n for key, start, end, n in rows}
    assert latest[("a", 90, 96)] == 2
    assert ("a", 20, 20) not in latest  # merges with nothing: late by its own time
    if final:
        assert sorted(rows) == [("a", 90, 96, 2), ("z", 101, 101, 1)]


@pytest.mark.parametrize("left", [False, True])
def test_a_table_table_join_retracts_only_results_that_existed(left: bool, tmp_path: Path) -> None:
    builder = StreamsBuilder()
    names = builder.table("names", key_serde=STRING, value_serde=JSON, persistent=False)
    places = builder.table("places", key_serde=STRING, value_serde=JSON, persistent=False)
    names.join(places, lambda name, place: [name, place], left=left).to_stream().to("joined")
    run = Offline(builder.build(), tmp_path)
    run.send("places", b"k", b'"north"', 1)  # no name: no result either way
    run.send("places", b"k", None, 2)  # nothing to retract
    run.send("names", b"k", b'"Ann"', 3)
    run.send("places", b"k", b'"south"', 4)
    run.send("places", b"k", None, 5)
    run.send("names", b"k", None, 6)
    joined = [None if v is None else json.loads(v) for _, v in run.out["joined"]]
    if left:
        assert joined == [["Ann", None], ["Ann", "south"], ["Ann", None], None]
    else:
        assert joined == [["Ann", "south"], None]


def test_a_quiet_table_does_not_hold_final_windows_back(tmp_path: Path) -> None:
    # The review's M7: stream.join(table) ... final() in one sub-topology; the table
    # delivered once and went quiet.
    builder = StreamsBuilder()
    customers = builder.table("customers", key_serde=STRING, value_serde=JSON, persistent=False)
    (
        builder.stream("orders", key_serde=STRING, value_serde=JSON)
        .join(customers, lambda order, customer: order)
        .group_by_key()
        .windowed_by(tumbling(100))
        .count()
        .final()
        .to_stream()
        .map(lambda w, n: (w.key, [w.start, w.end, n]), key_serde=STRING)
        .to("out")
    )
    run = Offline(builder.build(), tmp_path)
    assert len(run.built.subtopologies) == 1
    run.send("customers", b"c", b"{}", 1)
    for stamp in (10, 20, 500):
        run.send("orders", b"c", b"1", stamp)
    assert [json.loads(v or b"") for _, v in run.out["out"]] == [[0, 100, 2]]


def test_standbys_of_two_owners_expire_each_by_its_own_clock() -> None:
    """Two standby ranges tailed into one engine, their owners far apart in stream time:
    the slower range keeps its open windows until it moves on, and a standby that stopped
    holds nothing back."""
    retained = StoreSpec("w", STRING, JSON, retention_ms=2 * MINUTE, segment_ms=MINUTE)
    backend = open_window_backend(retained, None)
    low, high = KeyRange(0, FULL.end // 2), KeyRange(FULL.end // 2 + 1, FULL.end)
    slow_key, fast_key = key_in(low).encode(), key_in(high).encode()
    slow, fast = backend.tail(low), backend.tail(high)
    slow.apply([(slow_key, encode_change(4 * MINUTE, 5 * MINUTE, 0, b"1"))])
    fast.apply(
        [(fast_key, encode_change(m * MINUTE, (m + 1) * MINUTE, 0, b"1")) for m in range(40)]
    )
    assert backend.get_window(slow_key, 4 * MINUTE, 5 * MINUTE) == (0, b"1")
    backend.untail(low)
    fast.apply([(fast_key, encode_change(50 * MINUTE, 51 * MINUTE, 0, b"1"))])
    assert backend.get_window(slow_key, 4 * MINUTE, 5 * MINUTE) is None
    assert backend.get_window(fast_key, 0, MINUTE) is None
