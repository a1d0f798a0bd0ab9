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


class Traffic:
    """Zipf-keyed records at a steady rate, keyed so the producer's partitioner spreads them;
    remembers each partition's end offset from the acknowledgements, and what each record
    held (``sent``, by partition and offset)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        seed: int,
        rate_per_s: float,
        distinct_keys: int,
        values: Values = empty,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.seed = seed
        self.rate_per_s = rate_per_s
        self.distinct_keys = distinct_keys
        self.values = values
        self.ends: dict[int, int] = {}
        self.sent: dict[tuple[int, int], bytes] = {}
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
        try:
            while not self._stop.is_set():
                records = [
                    (key, self.values(rng)) for key in rng.choices(names, weights=weights, k=batch)
                ]
                deliveries = [
                    (value, await producer.send(self.topic, key=key, value=value))
                    for key, value in records
                ]
                for value, delivery in deliveries:
                    metadata = await delivery
                    self.sent[(metadata.partition, metadata.offset)] = value
                    end = metadata.offset + 1
                    self.ends[metadata.partition] = max(self.ends.get(metadata.partition, 0), end)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), tick_s)
        finally:
            await producer.stop()


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
