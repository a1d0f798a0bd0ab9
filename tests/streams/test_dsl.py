"""The DSL offline (no I/O): its topologies run by stream tasks against plain-Python
references, the window rules, and topology errors naming the step and its line."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from client.protocol.keyspace import KeyRange
from client.streams import INT64, JSON, STRING, Topology, TopologyError
from client.streams.dsl import StreamsBuilder, Windowed, hopping, session, tumbling
from client.streams.internal import for_application, plan_internal_topics
from client.streams.state import StateManager
from client.streams.task import StreamTask, TaskId
from client.streams.topology import BuiltTopology
from tests.streams.test_task import Rec

APP = "app"


class Offline:
    """One task per sub-topology over the whole key space; what a sink writes to an internal
    topic comes back in as that topic's input, the rest is kept per topic."""

    def __init__(self, topology: Topology, state: Path) -> None:
        self.built: BuiltTopology = for_application(topology.build(), APP)
        self.state = StateManager(self.built, state)
        self.tasks = {}
        for sub in self.built.subtopologies:
            backends = {name: self.state.backend(name, 0) for name in sub.stores}
            task = StreamTask(
                TaskId(sub.index, 0, KeyRange.full()), self.built, sub, backends, APP, 0
            )
            task.init()
            self.tasks[sub.index] = task
        self.out: dict[str, list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
        self.changelog: list[tuple[str, bytes | None, bytes | None]] = []
        self._offsets: Counter[str] = Counter()

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int) -> None:
        task = self.tasks[self.built.subtopology_of_topic(topic).index]
        offset = self._offsets[topic]
        self._offsets[topic] += 1
        task.add(topic, Rec(topic, offset, key, value, timestamp))
        while task.process_next(0) is True:
            pass
        for outgoing in list(task.outgoing):
            if outgoing.changelog_of is not None:
                self.changelog.append((outgoing.changelog_of, outgoing.key, outgoing.value))
            elif outgoing.topic in self.built.internal_topics:
                task.outgoing.remove(outgoing)
                self.send(outgoing.topic, outgoing.key, outgoing.value, timestamp)
                continue
            else:
                self.out[outgoing.topic].append((outgoing.key, outgoing.value))
        task.outgoing.clear()


def test_word_count_equals_a_counter(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        builder.stream("lines", key_serde=STRING, value_serde=STRING)
        .flat_map_values(str.split, value_serde=STRING)
        .group_by(lambda key, word: word, key_serde=STRING, name="words")
        .count()
        .to_stream()
        .to("counts", value_serde=INT64)
    )
    run = Offline(builder.build(), tmp_path)
    assert list(run.built.internal_topics) == ["app-words-repartition"]
    assert plan_internal_topics(run.built, {"lines": 3}) == {"app-words-repartition": 3}
    lines = ["a b c", "b c", "c", "a a"]
    for index, line in enumerate(lines):
        run.send("lines", b"%d" % index, line.encode(), index)
    latest = {key.decode(): INT64.deserialize(value) for key, value in run.out["counts"]}
    assert latest == Counter(" ".join(lines).split())


def test_stateless_steps_branch_and_merge(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    seen: list[Any] = []
    numbers = builder.stream("in", key_serde=STRING, value_serde=JSON).peek(
        lambda key, value: seen.append(value)
    )
    small, large = numbers.branch(lambda k, v: v < 10, lambda k, v: True)
    small.map_values(lambda v: v * 100).merge(large.filter(lambda k, v: v % 2 == 0)).map(
        lambda k, v: (f"{k}!", v), key_serde=STRING
    ).to("out")
    run = Offline(builder.build(), tmp_path)
    for index, value in enumerate([1, 12, 13, 5, 40]):
        run.send("in", b"k", json.dumps(value).encode(), index)
    assert seen == [1, 12, 13, 5, 40]
    assert [(k, json.loads(v or b"")) for k, v in run.out["out"]] == [
        (b"k!", 100),
        (b"k!", 12),
        (b"k!", 500),
        (b"k!", 40),
    ]


def windowed_reference(
    events: list[tuple[str, int]], windows_for: Any, closed: Any
) -> dict[tuple[str, int, int], int]:
    """Counts per (key, window) of records not late at their arrival (stream time = the
    largest timestamp so far)."""
    stream_time = -1
    counts: Counter[tuple[str, int, int]] = Counter()
    for key, timestamp in events:
        stream_time = max(stream_time, timestamp)
        for start, end in windows_for(timestamp):
            if not closed(end, stream_time):
                counts[(key, start, end)] += 1
    return dict(counts)


def windowed_app(windows: Any, *, final: bool, tmp_path: Path) -> Offline:
    builder = StreamsBuilder()
    table = builder.stream("views", key_serde=STRING, value_serde=JSON).group_by_key()
    counted = table.windowed_by(windows).count(persistent=True)
    (counted.final() if final else counted).to_stream().map(
        lambda w, n: (w.key, [w.start, w.end, n]), key_serde=STRING
    ).to("out")
    return Offline(builder.build(), tmp_path)


def shuffled_events(seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"u{rng.randrange(7)}", index * 10 + rng.randrange(-40, 40)) for index in range(400)]


@pytest.mark.parametrize(
    "windows", [tumbling(100, grace_ms=20), hopping(100, 25, grace_ms=30), hopping(100, 30)]
)
def test_final_windows_equal_the_reference_each_once(windows: Any, tmp_path: Path) -> None:
    events = [(key, max(0, stamp)) for key, stamp in shuffled_events(1)]
    run = windowed_app(windows, final=True, tmp_path=tmp_path)
    for key, stamp in events:
        run.send("views", key.encode(), b"{}", stamp)
    emitted = [(k.decode(), *json.loads(v or b"")) for k, v in run.out["out"]]
    keys = [(key, start, end) for key, start, end, _ in emitted]
    assert len(keys) == len(set(keys)), "a window emitted twice"
    stream_time = max(stamp for _, stamp in events)
    reference = windowed_reference(events, windows.windows_for, windows.closed)
    closed = {key: n for key, n in reference.items() if windows.closed(key[2], stream_time)}
    assert {(key, start, end): n for key, start, end, n in emitted} == closed


def test_updates_carry_every_count_and_the_last_one_is_the_reference(tmp_path: Path) -> None:
    windows = tumbling(100, grace_ms=50)
    events = [(key, max(0, stamp)) for key, stamp in shuffled_events(2)]
    run = windowed_app(windows, final=False, tmp_path=tmp_path)
    for key, stamp in events:
        run.send("views", key.encode(), b"{}", stamp)
    latest = {}
    for key, value in run.out["out"]:
        start, end, count = json.loads(value or b"")
        latest[(key.decode(), start, end)] = count
    assert latest == windowed_reference(events, windows.windows_for, windows.closed)


def test_sessions_merge_and_close(tmp_path: Path) -> None:
    windows = session(50)
    run = windowed_app(windows, final=True, tmp_path=tmp_path)
    # a: 0, 30, 70 one session; then 200 another; b: 10 then 100 (gap 90 > 50): two.
    for key, stamp in [("a", 0), ("b", 10), ("a", 30), ("a", 70), ("b", 100), ("a", 200)]:
        run.send("views", key.encode(), b"{}", stamp)
    run.send("views", b"z", b"{}", 1_000)
    emitted = sorted((k.decode(), *json.loads(v or b"")) for k, v in run.out["out"])
    assert emitted == [("a", 0, 70, 3), ("a", 200, 200, 1), ("b", 10, 10, 1), ("b", 100, 100, 1)]


def test_stream_table_and_table_table_joins(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    customers = builder.table("customers", key_serde=STRING, value_serde=JSON, persistent=False)
    regions = (
        builder.stream("moves", key_serde=STRING, value_serde=JSON)
        .group_by_key()
        .reduce(lambda old, new: new, persistent=False)
    )
    builder.stream("orders", key_serde=STRING, value_serde=JSON).join(
        customers, lambda order, customer: [order, customer["name"]]
    ).to("enriched")
    customers.join(regions, lambda customer, region: [customer["name"], region]).to_stream().to(
        "located"
    )
    run = Offline(builder.build(), tmp_path)
    assert len(run.built.subtopologies) == 1  # co-partitioned: one task reads all three
    run.send("orders", b"c1", b"1", 1)  # no customer yet: an inner join drops it
    run.send("customers", b"c1", b'{"name":"Ann"}', 2)
    run.send("orders", b"c1", b"2", 3)
    run.send("moves", b"c1", b'"north"', 4)
    run.send("customers", b"c1", b'{"name":"Anna"}', 5)
    assert [json.loads(v or b"") for _, v in run.out["enriched"]] == [[2, "Ann"]]
    located = [None if v is None else json.loads(v) for _, v in run.out["located"]]
    # The customer's first change met no region: no result, so nothing to retract.
    assert located == [["Ann", "north"], ["Anna", "north"]]
    # The table's store writes no changelog: the customers topic is its changelog.
    assert "table-1-store" not in {store for store, _, _ in run.changelog}
    assert run.changelog


def test_a_topology_error_names_the_step_and_its_line() -> None:
    builder = StreamsBuilder()
    builder.stream("in")
    with pytest.raises(TopologyError, match=r"stream 'stream-2' \(tests/streams/test_dsl.py:\d+\)"):
        builder.stream("in")
    with pytest.raises(TopologyError, match=r"filter \(tests/streams/test_dsl.py:\d+\).*callable"):
        builder.stream("other").filter("not a function")  # type: ignore[arg-type]
    grouped = builder.stream("third").map(lambda k, v: (v, k)).group_by_key()
    with pytest.raises(TopologyError, match="session windows need a callable merger"):
        grouped.windowed_by(session(10)).aggregate(list, lambda k, v, agg: agg)
    counted = grouped.windowed_by(tumbling(10)).count()
    counted.to_stream()
    with pytest.raises(TopologyError, match="call final"):
        counted.final()


def test_window_rules() -> None:
    assert tumbling(100).windows_for(250) == [(200, 300)]
    assert hopping(100, 50).windows_for(120) == [(50, 150), (100, 200)]
    assert hopping(100, 50).windows_for(10) == [(0, 100)]
    assert hopping(100, 30).windows_for(95) == [(0, 100), (30, 130), (60, 160), (90, 190)]
    assert hopping(100, 30).windows_for(100) == [(30, 130), (60, 160), (90, 190)]
    assert tumbling(100, grace_ms=10).closed(300, 310) and not tumbling(100, 10).closed(300, 309)
    with pytest.raises(ValueError):
        hopping(100, 200)
    sessions = session(50, grace_ms=5)
    assert sessions.late(94, 100) and not sessions.late(95, 100)
    assert sessions.closed(44, 100) and not sessions.closed(45, 100)
    assert Windowed("k", 0, 1).key == "k"


def test_a_jump_past_the_retention_still_emits_the_closed_windows(tmp_path: Path) -> None:
    run = windowed_app(tumbling(100), final=True, tmp_path=tmp_path)
    run.send("views", b"a", b"{}", 50)
    # Ten minutes on: the store expires the first segment at this record's write.
    run.send("views", b"b", b"{}", 10 * 60_000)
    assert [(k, json.loads(v or b"")) for k, v in run.out["out"]] == [(b"a", [0, 100, 1])]
