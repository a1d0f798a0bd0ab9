"""What the streams runtime needs of the world around it, as protocols: the consumer's record
feed (``client.consumer_source.ConsumerSource`` in an application), the producer for sinks and
changelogs (aiokafka's ``AIOKafkaProducer``) and the restorer of stores from their changelogs
(``client.streams.restore.Restorer``). Typed on these, the runtime runs without a broker over
an in-memory feed and a fake producer (tests/streams/test_runtime_offline.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from aiokafka.structs import TopicPartition

from client.runtime.seams import RecordSource
from client.streams.restore import RestoreProgress
from client.streams.stores import BytesStore


class StreamSource(RecordSource, Protocol):
    """``run()``'s seams plus the session deadline a pool thread compares, and pausing the
    partitions whose tasks hold too many records."""

    def session_deadline(self) -> float:
        """The monotonic instant from which nothing may be handed out; a thread may ask."""

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...


class Batch(Protocol):
    """A record batch being filled for one topic-partition (aiokafka's ``BatchBuilder``)."""

    def append(
        self,
        *,
        timestamp: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
    ) -> object | None:
        """Add a record; None when the batch is full (its first record always fits)."""

    def record_count(self) -> int: ...

    def size(self) -> int: ...

    def close(self) -> None: ...


class Producer(Protocol):
    """What ``client.streams.outputs`` hands records to, a batch at a time: ``send_batch``
    queues a batch and returns its delivery (a future of its first record's metadata: topic,
    partition, offset), waiting while the partition's previous batch is queued; ``flush``
    waits for every queued one; ``partitions_for`` says a topic's partitions."""

    def create_batch(self) -> Batch: ...

    async def send_batch(
        self, batch: Batch, topic: str, *, partition: int
    ) -> asyncio.Future[Any]: ...

    async def partitions_for(self, topic: str) -> set[int]: ...

    async def flush(self) -> None: ...


class StoreRestorer(Protocol):
    async def restore(
        self,
        topic: str,
        progress: RestoreProgress,
        backend: BytesStore,
        on_progress: Callable[[RestoreProgress], None] = ...,
    ) -> RestoreProgress:
        """Read ``topic`` into ``backend`` for ``progress``'s ranges up to the end it saw,
        or up to ``progress.stop_at`` where that comes first."""
