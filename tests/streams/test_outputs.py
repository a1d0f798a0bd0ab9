"""The outputs handed to the producer as record batches (``client.streams.outputs``): each
partition's records in the order produced, split at the batch size, held while the
partition's previous batch is unacknowledged, the gate asked at the hand-over, a failed batch
failing every task in it, and a changelog batch noting its last offset."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import RecordMetadata, TopicPartition

from client.streams.errors import SendFailed
from client.streams.outputs import Outputs
from client.streams.task import Outgoing, TaskState
from tests.streams.test_runtime_offline import Batch


@dataclass(eq=False)
class Task:
    id: str
    outgoing: list[Outgoing] = field(default_factory=list)
    state: TaskState = TaskState.RUNNING


class Gate:
    def may_send(self, task: Task) -> bool:
        return task.state is not TaskState.HALTED


class Written:
    def __init__(self) -> None:
        self.ends: dict[tuple[str, int], int] = {}

    def note_written(self, changelog: str, partition: int, offset: int) -> None:
        self.ends[(changelog, partition)] = offset + 1


class Producer:
    """Keeps each batch's delivery open until the test settles it, or acknowledges each at
    the loop's next turn (``auto``)."""

    def __init__(self, partitions: int = 1, batch_records: int = 2, auto: bool = False) -> None:
        self.partitions = partitions
        self.batch_records = batch_records
        self.auto = auto
        self.batches: list[tuple[str, int, list[bytes | None]]] = []
        self.deliveries: list[asyncio.Future[Any]] = []
        self._offsets: dict[tuple[str, int], int] = {}

    def create_batch(self) -> Batch:
        return Batch(self.batch_records)

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        assert batch.closed, "a batch is closed before it is handed over"
        self.batches.append((topic, partition, [key for key, _, _ in batch.records]))
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        if self.auto:
            asyncio.get_running_loop().call_soon(self.acknowledge, len(self.deliveries) - 1)
        return delivery

    def acknowledge(self, index: int) -> None:
        topic, partition, keys = self.batches[index]
        offset = self._offsets.get((topic, partition), 0)
        self._offsets[(topic, partition)] = offset + len(keys)
        self.deliveries[index].set_result(
            RecordMetadata(topic, partition, TopicPartition(topic, partition), offset, -1, 0, 0)
        )

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions))

    async def flush(self) -> None:
        for index, delivery in enumerate(self.deliveries):
            if not delivery.done():
                self.acknowledge(index)
        if self.deliveries:
            await asyncio.wait(self.deliveries)


def outputs(producer: Producer, written: Written | None = None) -> tuple[Outputs, list[str]]:
    woken: list[str] = []
    made = Outputs(
        cast(Any, producer),
        cast(Any, written or Written()),
        cast(Any, Gate()),
        on_failure=lambda: woken.append("failure"),
        wake=lambda: woken.append("wake"),
    )
    return made, woken


def sink(key: bytes, topic: str = "counts") -> Outgoing:
    return Outgoing(topic, None, key, b"1")


async def test_records_go_in_order_in_batches_to_the_default_partitioners_partition() -> None:
    producer = Producer(partitions=3, batch_records=2, auto=True)
    out, _ = outputs(producer)
    keys = [b"key-%d" % index for index in range(12)]
    first, second = Task("a"), Task("b")
    first.outgoing = [sink(key) for key in keys[:6]]
    second.outgoing = [sink(key) for key in keys[6:]]
    await out.send(cast(Any, [first, second]))
    await out.flush()

    assert not first.outgoing and not second.outgoing
    default = DefaultPartitioner()
    for partition in range(3):
        expected = [key for key in keys if default(key, [0, 1, 2], [0, 1, 2]) == partition]
        sent = [key for _, p, batch in producer.batches if p == partition for key in batch]
        assert sent == expected
    assert all(len(batch) <= 2 for _, _, batch in producer.batches)


async def test_records_wait_while_their_partitions_batch_is_in_flight_then_go() -> None:
    producer = Producer()
    out, woken = outputs(producer)
    task = Task("a", [sink(b"x")])
    await out.send(cast(Any, [task]))
    assert [batch for _, _, batch in producer.batches] == [[b"x"]]

    task.outgoing = [sink(b"y"), sink(b"z")]
    await out.send(cast(Any, [task]))
    assert len(producer.batches) == 1, "handed over while the previous batch was in flight"

    producer.acknowledge(0)
    await asyncio.sleep(0)
    assert woken == ["wake"]
    await out.send(cast(Any, []))
    assert [batch for _, _, batch in producer.batches] == [[b"x"], [b"y", b"z"]]


async def test_a_flush_hands_over_what_waits_and_a_changelog_batch_notes_its_last_offset() -> None:
    producer, written = Producer(batch_records=10), Written()
    out, _ = outputs(producer, written)
    task = Task("a", [Outgoing("log", 0, b"k", b"1", changelog_of="counts")])
    await out.send(cast(Any, [task]))
    task.outgoing = [Outgoing("log", 0, key, b"2", changelog_of="counts") for key in (b"k", b"l")]
    await out.send(cast(Any, [task]))
    assert len(producer.batches) == 1
    flushing = asyncio.create_task(out.flush())
    await asyncio.sleep(0.01)
    assert len(producer.batches) == 1, "handed over while the previous batch was in flight"
    producer.acknowledge(0)
    await asyncio.wait_for(flushing, 5)
    assert [batch for _, _, batch in producer.batches] == [[b"k"], [b"k", b"l"]]
    # Three changelog records at offsets 0, 1 and 2: the end is 3.
    assert written.ends == {("log", 0): 3}


async def test_a_task_halted_before_the_hand_over_has_its_waiting_records_withheld(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = Producer(batch_records=10)
    out, _ = outputs(producer)
    kept, halted = Task("kept"), Task("halted")
    kept.outgoing, halted.outgoing = [sink(b"a")], [sink(b"b")]
    await out.send(cast(Any, [kept, halted]))
    kept.outgoing, halted.outgoing = [sink(b"c")], [sink(b"d"), sink(b"e")]
    await out.send(cast(Any, [kept, halted]))
    # The membership is lost while they wait for the first batch.
    halted.state = TaskState.HALTED
    producer.acknowledge(0)
    with caplog.at_level(logging.WARNING):
        await out.flush()
    assert [batch for _, _, batch in producer.batches] == [[b"a", b"b"], [b"c"]]
    (withheld,) = [r for r in caplog.records if r.getMessage().startswith("outputs withheld")]
    assert cast(Any, withheld).records == 2


async def test_a_failed_batch_fails_every_task_in_it_and_every_later_flush() -> None:
    producer = Producer(batch_records=10)
    out, woken = outputs(producer)
    first, second = Task("a", [sink(b"a")]), Task("b", [sink(b"b")])
    await out.send(cast(Any, [first, second]))
    producer.deliveries[0].set_exception(RuntimeError("the broker said no"))
    with pytest.raises(SendFailed):
        await out.flush()
    assert woken == ["failure"]
    assert out._reported == {first, second}
    with pytest.raises(SendFailed):
        await out.send(cast(Any, [first]))


async def test_a_record_over_the_request_size_is_refused_before_it_is_handed_over() -> None:
    producer = Producer()
    out, _ = outputs(producer)
    huge = Task("a", [Outgoing("counts", None, b"k", b"x" * 2_000_000)])
    with pytest.raises(SendFailed, match="max_request_size"):
        await out.send(cast(Any, [huge]))
    assert producer.batches == []


async def test_a_topic_whose_partitions_cannot_be_learnt_fails_the_task() -> None:
    class NoTopic(Producer):
        async def partitions_for(self, topic: str) -> set[int]:
            raise RuntimeError("unknown topic")

    out, woken = outputs(NoTopic())
    with pytest.raises(SendFailed, match="unknown topic"):
        await out.send(cast(Any, [Task("a", [sink(b"k", topic="missing")])]))
    assert woken == ["failure"]


class LoggingGate(Gate):
    """Notes, at each question, how many of the producer's batches are unacknowledged."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.asked_while_in_flight: list[int] = []

    def may_send(self, task: Task) -> bool:
        self.asked_while_in_flight.append(
            sum(not delivery.done() for delivery in self.producer.deliveries)
        )
        return super().may_send(task)


async def test_the_gate_is_asked_only_once_the_partitions_previous_batch_is_acknowledged() -> None:
    """Issue 46 item 8: a round's outputs over a batch, and a flush behind a batch in
    flight, ask the gate for the next batch only once the one before is acknowledged.
    Before, the gate answered first and the producer's ``send_batch`` then waited for the
    queued batch (up to ``request_timeout_ms``) with that answer in hand."""
    producer = Producer(batch_records=2)
    gate = LoggingGate(producer)
    out = Outputs(cast(Any, producer), cast(Any, Written()), cast(Any, gate), lambda: None)
    # Five records, two a batch: the round waits until no more than a batch's worth waits.
    task = Task("a", [sink(key) for key in (b"a", b"b", b"c", b"d", b"e")])
    sending = asyncio.create_task(out.send(cast(Any, [task])))
    await asyncio.sleep(0.01)
    assert [batch for _, _, batch in producer.batches] == [[b"a", b"b"]]
    producer.acknowledge(0)
    await asyncio.wait_for(sending, 5)
    assert [batch for _, _, batch in producer.batches] == [[b"a", b"b"], [b"c", b"d"]]

    task.outgoing = [sink(b"f")]
    await out.send(cast(Any, [task]))
    flushing = asyncio.create_task(out.flush())
    await asyncio.sleep(0.01)
    assert len(producer.batches) == 2
    producer.acknowledge(1)
    await asyncio.wait_for(flushing, 5)
    assert [batch for _, _, batch in producer.batches][-1] == [b"e", b"f"]
    assert gate.asked_while_in_flight == [0, 0, 0]


class QueueingProducer(Producer):
    """As aiokafka's ``send_batch``: waits for an unknown topic's metadata, then for the
    partition's queued batch, and only then queues; ``waiting`` is set once it waits."""

    def __init__(self, batch_records: int = 10) -> None:
        super().__init__(batch_records=batch_records)
        self.known: set[str] = set()
        self.metadata = asyncio.Event()
        self.waiting = asyncio.Event()

    async def _learn(self, topic: str) -> None:
        if topic not in self.known:
            self.waiting.set()
            await self.metadata.wait()
            self.known.add(topic)

    async def partitions_for(self, topic: str) -> set[int]:
        await self._learn(topic)
        return await super().partitions_for(topic)

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        await self._learn(topic)
        queued = [
            delivery
            for (at_topic, at_partition, _), delivery in zip(
                self.batches, self.deliveries, strict=True
            )
            if (at_topic, at_partition) == (topic, partition) and not delivery.done()
        ]
        if queued:
            self.waiting.set()
            await asyncio.wait(queued)
        return await super().send_batch(batch, topic, partition=partition)


def changelog(key: bytes) -> Outgoing:
    return Outgoing("log", 0, key, b"1", changelog_of="counts")


@pytest.mark.parametrize("wait", ["metadata", "queued batch"])
async def test_a_batch_past_the_gate_is_queued_with_no_wait_in_between(wait: str) -> None:
    """The membership is lost while the producer would wait (for the changelog topic's
    metadata, or for the partition's batch in flight): nothing of the halted task is queued
    after the loss. Before, the gate had said yes before the wait, and the batch was queued
    once the wait ended: a late write, landing after the heir's."""
    producer = QueueingProducer()
    out, _ = outputs(producer)
    task = Task("a", [changelog(b"first")])
    if wait == "metadata":
        handing = asyncio.create_task(out.send(cast(Any, [task])))
        await asyncio.wait_for(producer.waiting.wait(), 5)
    else:
        producer.known.add("log")
        await out.send(cast(Any, [task]))
        task.outgoing = [changelog(b"late")]
        await out.send(cast(Any, [task]))
        handing = asyncio.create_task(out.flush())
        await asyncio.sleep(0.01)
    task.state = TaskState.HALTED
    producer.metadata.set()
    if producer.deliveries:
        producer.acknowledge(0)
    await asyncio.wait_for(handing, 5)
    queued = [key for _, _, batch in producer.batches for key in batch]
    assert queued == ([] if wait == "metadata" else [b"first"])
