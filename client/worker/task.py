"""What user code implements for the worker runtime: a task per sub-partition (kafka-workers'
``WorkerTask``), the partitioner that makes sub-partitions (``WorkerPartitioner``) and the
observer a task acknowledges each record through (``RecordStatusObserver``).

A method written ``async def`` runs on the event loop; a plain method of a task runs on the
worker's thread pool, except ``init`` and ``accept``, which run on the event loop and must be
quick (``accept`` is asked for every record). Calls into one task never overlap.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka.structs import TopicPartition

from client.fetcher import Record

if TYPE_CHECKING:
    from client.worker.config import WorkerConfig


@dataclass(frozen=True, slots=True)
class SubPartition:
    """One of ``count`` in-process lanes of a partition; a task instance serves one."""

    topic: str
    partition: int
    index: int
    count: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class RecordObserver(Protocol):
    """How a task reports a record's outcome, once, from any task or thread, during or after
    ``process``. Neither call within ``processing_timeout_s`` counts as a failure."""

    def success(self) -> None: ...

    def failure(self, error: BaseException) -> None: ...


class WorkerTask:
    """Processes the records of one sub-partition, in offset order (a record whose key has an
    earlier record not acknowledged yet waits). Override ``process``; the rest is optional.

    ``process`` must acknowledge through ``observer`` (now or later); raising from it counts
    as ``observer.failure``. ``punctuate`` runs every ``punctuate_interval_s`` whether or not
    records arrive. ``close`` runs when the member no longer owns any slice of the partition,
    after the records in processing finished or the revoke timeout passed, and at shutdown.
    """

    def init(self, subpartition: SubPartition, config: WorkerConfig) -> None:
        return None

    def accept(self, record: Record) -> bool:
        """False holds the queue's head back (asked again when a record arrives or is
        acknowledged in this sub-partition, and after every ``punctuate``)."""
        return True

    def process(self, record: Record, observer: RecordObserver) -> Awaitable[None] | None:
        raise NotImplementedError

    def punctuate(self, now: float) -> Awaitable[None] | None:
        return None

    def close(self) -> Awaitable[None] | None:
        return None


class Partitioner(Protocol):
    """Maps a record to its sub-partition, ``0 <= index < count(partition)``. It must give
    every record of a key the same index, or per-key order does not hold."""

    def subpartition(self, record: Record, key_hash: int) -> int: ...

    def count(self, tp: TopicPartition) -> int: ...


class KeyHashPartitioner:
    """The default: key hash modulo ``subpartitions``, the same for every partition."""

    def __init__(self, subpartitions: int = 1) -> None:
        if subpartitions < 1:
            raise ValueError("subpartitions must be at least 1")
        self._count = subpartitions

    def subpartition(self, record: Any, key_hash: int) -> int:
        return key_hash % self._count

    def count(self, tp: TopicPartition) -> int:
        return self._count
