"""The seams between the consumer and the runtimes that drive it (``run()``'s dispatcher,
``client.worker``, ``client.streams``): what a runtime may ask of the consumer's records
(``RecordSource``, ``WorkerSource``) and what the consumer asks of a runtime (``Runtime``: to
run, and the lifecycle hooks).

They live in the kernel, apart from any one implementation, so a runtime and the consumer
depend on the seam and not on each other: the consumer builds the one implementation of the
sources (``client.consumer_source``) from its parts, and ``KeyrangeConsumer.drive`` hands it to
whichever runtime it runs.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiokafka.structs import TopicPartition

from client.fetcher import Item, Record
from client.protocol.keyspace import KeyRange
from client.runtime.gate import Lease, OwnershipGate
from client.runtime.hooks import LifecycleHooks


class RecordSource(Protocol):
    """What ``run()``'s dispatcher needs of the consumer."""

    @property
    def stopped(self) -> bool:
        """The consumer was stopped (a ``ConsumerStopped`` then ends the run quietly)."""

    async def next_item(self, interrupt: asyncio.Future[None]) -> Item:
        """The next record to hand out; ``FetchInterrupted`` once ``interrupt`` is done."""

    @property
    def gate(self) -> OwnershipGate:
        """Asked immediately before user code starts a record (docs/design.md §5)."""

    def may_hand_out(self) -> bool:
        """Asked right before each hand-out (docs/design.md §5); notices a passed session
        deadline."""

    def hand_out(self, tp: TopicPartition, record: Record, hashed: int) -> Lease | None:
        """The record is with user code from now on; the lease it may start under."""

    def give_back(self, record: Record) -> None:
        """Handed out and not processed: no longer with user code."""

    def mark_processed(self, record: Record) -> None: ...


class WorkerSource(RecordSource, Protocol):
    """``run()``'s seams plus pausing fetches, the session deadline for checks off the event
    loop, and the progress metrics read."""

    def session_deadline(self) -> float:
        """The monotonic instant from which nothing may be handed out; a thread may ask."""

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def highwater(self, tp: TopicPartition) -> int | None: ...

    def slice_watermarks(self) -> list[tuple[TopicPartition, KeyRange, int]]: ...


class Runtime(LifecycleHooks, Protocol):
    """What the consumer drives: ``run()``'s dispatcher, or another runtime over the same
    source (``KeyrangeConsumer.drive``). It hears ownership changes and the stop through the
    lifecycle hooks (``client.runtime.hooks``), once its composition root registered it."""

    async def run(self) -> None:
        """Take records from the source and process them until ``stopping`` or a failure."""
