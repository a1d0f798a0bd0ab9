"""The records a chaos run sends, and reading topics back to their high watermarks (the
embedded broker's ListOffsets "latest" is not to be trusted: a fetch's high watermark is)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition

from tests.chaos.targets import POISON

# Values for the word count: a small vocabulary, so the hot words meet every fault.
VOCABULARY = [f"w{rank}" for rank in range(120)]
WORDS_PER_LINE = 3
# Share of the workers' records that fail every attempt and end on the dead-letter topic.
POISON_SHARE = 0.003

Values = Callable[[random.Random], bytes]


def empty(_: random.Random) -> bytes:
    return b""


def sometimes_poison(rng: random.Random) -> bytes:
    return POISON if rng.random() < POISON_SHARE else b""


def line(rng: random.Random) -> bytes:
    weights = [1.0 / rank for rank in range(1, len(VOCABULARY) + 1)]
    return " ".join(rng.choices(VOCABULARY, weights=weights, k=WORDS_PER_LINE)).encode()


def view(_: random.Random) -> bytes:
    """A page view: the example reads JSON values, and counts them whatever they hold."""
    return b"{}"


class Traffic:
    """Zipf-keyed records at a steady rate, keyed so the producer's partitioner spreads them;
    remembers each partition's end offset from the acknowledgements, and what each record
    held (``sent``, by partition and offset).

    With ``event_step_ms`` each record's timestamp is ``step`` after the one before (from the
    minute the traffic starts in), so event time runs ahead of the wall clock and windows
    close during a run; ``stamped`` keeps each record's key and timestamp. Once stopped, it
    sends one record per key ``close_after_ms`` past the last stamp (not in ``stamped``):
    every key's task sees its stream time pass every window before it, so every window
    closes."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        seed: int,
        rate_per_s: float,
        distinct_keys: int,
        values: Values = empty,
        event_step_ms: int = 0,
        close_after_ms: int = 0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.seed = seed
        self.rate_per_s = rate_per_s
        self.distinct_keys = distinct_keys
        self.values = values
        self.ends: dict[int, int] = {}
        self.sent: dict[tuple[int, int], bytes] = {}
        self.event_step_ms = event_step_ms
        self.close_after_ms = close_after_ms
        self.stamped: dict[tuple[int, int], tuple[str, int]] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="chaos-traffic")

    async def stop(self) -> dict[int, int]:
        self._stop.set()
        if self._task is not None:
            await self._task
        return dict(self.ends)

    async def _run(self) -> None:
        rng = random.Random(self.seed)
        names = [b"key-%d" % rank for rank in range(self.distinct_keys)]
        weights = [1.0 / rank for rank in range(1, len(names) + 1)]
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks=1, enable_idempotence=False, linger_ms=5
        )
        await producer.start()
        tick_s = 0.05
        batch = max(1, round(self.rate_per_s * tick_s))
        # The minute the run starts in: windows line up with the first record.
        stamp = int(time.time() * 1000) // 60_000 * 60_000
        try:
            while not self._stop.is_set():
                records = [
                    (key, self.values(rng)) for key in rng.choices(names, weights=weights, k=batch)
                ]
                stamps: list[int | None] = [None] * batch
                if self.event_step_ms:
                    stamps = [stamp + index * self.event_step_ms for index in range(batch)]
                    stamp += batch * self.event_step_ms
                await self._send(producer, records, stamps)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), tick_s)
            if self.event_step_ms:
                closing = [(name, self.values(rng)) for name in names]
                last = stamp + self.close_after_ms
                await self._send(producer, closing, [last] * len(names), closing=True)
        finally:
            await producer.stop()

    async def _send(
        self,
        producer: AIOKafkaProducer,
        records: list[tuple[bytes, bytes]],
        stamps: list[int | None],
        *,
        closing: bool = False,
    ) -> None:
        """Send in order, then note each acknowledged record (a partition's records keep
        their order: one producer, sends awaited in turn)."""
        deliveries = [
            (key, stamp, await producer.send(self.topic, key=key, value=value, timestamp_ms=stamp))
            for (key, value), stamp in zip(records, stamps, strict=True)
        ]
        for (key, stamp, delivery), (_, value) in zip(deliveries, records, strict=True):
            metadata = await delivery
            slot = (metadata.partition, metadata.offset)
            self.sent[slot] = value
            if stamp is not None and not closing:
                self.stamped[slot] = (key.decode(), stamp)
            end = metadata.offset + 1
            self.ends[metadata.partition] = max(self.ends.get(metadata.partition, 0), end)


async def read_topic(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 60
) -> tuple[list[ConsumerRecord[bytes, bytes]], dict[int, int]]:
    """Every record of the topic, each partition read from 0 to the high watermark its
    fetches report; and those high watermarks."""
    highs: dict[int, int] = {}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        owned = [TopicPartition(topic, partition) for partition in range(partitions)]
        consumer.assign(owned)
        for tp in owned:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout_s
        pending = set(owned)
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to its high watermark in {timeout_s} s")
            batch = await consumer.getmany(*pending, timeout_ms=200)
            for got in batch.values():
                records.extend(got)
            for tp in list(pending):
                high = consumer.highwater(tp)
                if high is not None and await consumer.position(tp) >= high:
                    highs[tp.partition] = high
                    pending.discard(tp)
    finally:
        await consumer.stop()
    return records, highs


def last_values(records: list[ConsumerRecord[bytes, bytes]]) -> dict[str, int]:
    """The last value per key of an INT64-valued topic (a tombstone removes the key)."""
    latest: dict[str, int] = {}
    for record in sorted(records, key=lambda record: (record.partition, record.offset)):
        assert record.key is not None
        if record.value is None:
            latest.pop(record.key.decode(), None)
        else:
            latest[record.key.decode()] = int.from_bytes(record.value, "big", signed=True)
    return latest


def values_in_order(records: list[ConsumerRecord[bytes, bytes]]) -> dict[str, list[int]]:
    """Every value of each key of an INT64-valued topic, in offset order (tombstones left
    out)."""
    values: dict[str, list[int]] = {}
    for record in sorted(records, key=lambda record: (record.partition, record.offset)):
        if record.key is not None and record.value is not None:
            value = int.from_bytes(record.value, "big", signed=True)
            values.setdefault(record.key.decode(), []).append(value)
    return values
