"""A task on its own (no I/O): punctuation order with out-of-order timestamps, forwarding,
the store's key-range guard and the context's record metadata."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange, key_hash
from client.runtime.gate import OwnershipGate
from client.streams import (
    STRING,
    Processor,
    ProcessorFailed,
    StoreKeyOutsideTask,
    StoreSpec,
    Topology,
)
from client.streams.gate import TaskGate
from client.streams.rounds import process_for
from client.streams.serde import JSON
from client.streams.stores import MemoryStore
from client.streams.task import StreamTask, TaskId, TaskState
from examples import streams_windowed

FULL = KeyRange.full()


@dataclass
class Rec:
    """A consumed record's fields, as aiokafka's ConsumerRecord has them."""

    topic: str
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    partition: int = 0
    headers: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def serialized_key_size(self) -> int:
        return -1 if self.key is None else len(self.key)

    @property
    def serialized_value_size(self) -> int:
        return -1 if self.value is None else len(self.value)


def task_of(topology: Topology, keys: KeyRange = FULL) -> StreamTask:
    built = topology.build()
    sub = built.subtopologies[0]
    backends = {name: MemoryStore() for name in sub.stores}
    task = StreamTask(TaskId(0, 0, keys), built, sub, backends, "app", max_idle_ms=0)  # type: ignore[arg-type]
    task.init()
    return task


def gate_for(tasks: list[StreamTask]) -> TaskGate:
    """The ownership gate of a member that owns the whole of partition 0 of ``in``."""
    ownership = OwnershipGate(lambda: math.inf)
    ownership.grant({TopicPartition("in", 0): [FULL]})
    gate = TaskGate(ownership, lambda: True, lambda: math.inf)
    for task in tasks:
        gate.grant(task, "in")
    return gate


def run_all(task: StreamTask) -> None:
    while task.process_next(0) is True:
        pass


def test_stream_time_punctuation_fires_in_order_with_out_of_order_timestamps() -> None:
    with mock.patch.dict(os.environ, {"WINDOW_MS": "100", "WINDOW_INPUT": "clicks"}):
        task = task_of(streams_windowed.build_topology())
    timestamps = [5, 130, 40, 250, 120, 90, 260, 410, 305, 999]
    for offset, timestamp in enumerate(timestamps):
        task.add("clicks", Rec("clicks", offset, b"k", b"{}", timestamp))
    run_all(task)
    emitted = [
        (record.key, JSON.deserialize(record.value))
        for record in task.outgoing
        if record.changelog_of is None
    ]
    windows = [value["start"] for _, value in emitted]
    assert windows == sorted(windows) and len(windows) == len(set(windows))
    # Punctuations at stream times 130, 250, 410 and 999 emit the windows ending by then;
    # 40, 120, 90 and 305 arrive after their window was emitted: late, dropped.
    counts = {value["start"]: value["count"] for _, value in emitted}
    assert counts == {0: 1, 100: 1, 200: 2, 400: 1}
    assert task.metrics.punctuations == 4
    assert task.inputs.stream_time == 999


class Route(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value, to="odd" if int(value) % 2 else "even")


class Remember(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.state_store("seen").put(key, value)
        self.context.forward(
            key, f"{self.context.topic}:{self.context.offset}:{self.context.timestamp}"
        )


def routing_topology() -> Topology:
    return (
        Topology()
        .add_source("in", "numbers", key_serde=STRING, value_serde=STRING)
        .add_processor("route", Route, "in")
        .add_processor("odd", Remember, "route")
        .add_sink("even", "evens", "route", key_serde=STRING, value_serde=STRING)
        .add_sink("odd-out", "odds", "odd", key_serde=STRING, value_serde=STRING)
        .add_state_store(StoreSpec("seen", STRING, STRING), "odd")
    )


def test_forward_to_a_named_child_and_the_context_metadata() -> None:
    task = task_of(routing_topology())
    task.add("numbers", Rec("numbers", 7, b"a", b"3", 1_000))
    task.add("numbers", Rec("numbers", 8, b"b", b"4", 1_001))
    run_all(task)
    sent = [(out.topic, out.key, out.value) for out in task.outgoing]
    assert ("odds", b"a", b"numbers:7:1000") in sent
    assert ("evens", b"b", b"4") in sent
    changelog = [out for out in task.outgoing if out.changelog_of == "seen"]
    assert [(out.topic, out.partition, out.key) for out in changelog] == [
        ("app-seen-changelog", 0, b"a")
    ]
    assert [record.offset for record in task.processed] == [7, 8]


def test_a_store_refuses_a_key_outside_its_task_range() -> None:
    owned = key_hash(b"a", 0)
    task = task_of(routing_topology(), KeyRange(owned, owned))
    task.add("numbers", Rec("numbers", 0, b"a", b"3", 0))
    run_all(task)
    task.add("numbers", Rec("numbers", 1, b"zz", b"5", 0))
    with pytest.raises(StoreKeyOutsideTask, match="store 'seen'"):
        run_all(task)


class Explode(Processor):
    def process(self, key: Any, value: Any) -> None:
        raise ValueError("no such customer")


def test_a_failing_processor_is_named_with_its_record() -> None:
    task = task_of(
        Topology()
        .add_source("in", "numbers", key_serde=STRING, value_serde=STRING)
        .add_processor("explode", Explode, "in")
    )
    task.add("numbers", Rec("numbers", 41, b"k", b"v", 0))
    with pytest.raises(ProcessorFailed, match=r"processor 'explode' failed on numbers\[0\]@41"):
        run_all(task)
    assert task.processed == []


def test_a_task_halted_mid_round_takes_no_further_record() -> None:
    """As when the membership is lost while a pool thread runs the task: the record under
    way finishes, the buffered ones stay untouched."""
    seen: list[str] = []
    tasks: list[StreamTask] = []

    class HaltAfterOne(Processor):
        def process(self, key: Any, value: Any) -> None:
            seen.append(value)
            tasks[0].state = TaskState.HALTED

    topology = (
        Topology()
        .add_source("in", "in", key_serde=STRING, value_serde=STRING)
        .add_processor("halt", HaltAfterOne, "in")
    )
    tasks.append(task_of(topology))
    gate = gate_for(tasks)
    for offset in range(3):
        tasks[0].add("in", Rec("in", offset, b"k", b"v%d" % offset, offset))
    assert process_for(gate, tasks, 0, math.inf) is True
    assert seen == ["v0"]
    assert tasks[0].inputs.buffered()


def test_no_task_takes_a_record_once_the_session_deadline_passed_mid_round() -> None:
    """The loop blocked, or the process froze, inside a round: the member's session may have
    expired at the coordinator meanwhile, so the round stops there; not even another task's
    buffered record is processed (docs/design.md §5, the client half)."""
    seen: list[str] = []
    session_deadline = time.monotonic() + 0.05

    class FreezeOnce(Processor):
        def process(self, key: Any, value: Any) -> None:
            seen.append(value)
            if len(seen) == 1:
                time.sleep(max(0.0, session_deadline - time.monotonic()) + 0.01)

    topology = (
        Topology()
        .add_source("in", "in", key_serde=STRING, value_serde=STRING)
        .add_processor("freeze", FreezeOnce, "in")
    )
    halves = FULL.split(2)
    tasks = [task_of(topology, keys) for keys in halves]
    gate = gate_for(tasks)
    for task, key in zip(tasks, (b"left", b"right"), strict=True):
        for offset in range(3):
            task.add("in", Rec("in", offset, key, f"{key.decode()}{offset}".encode(), offset))
    assert process_for(gate, tasks, 0, session_deadline) is True
    assert len(seen) == 1
    assert sum(task.inputs.buffered() for task in tasks) == 5
    # Before the deadline a round goes on as usual, task after task.
    seen.clear()
    assert process_for(gate, tasks, 0, math.inf) is True
    assert len(seen) == 5
