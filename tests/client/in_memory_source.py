"""The record feed the runtime tests drive a runtime with, without Kafka: records the test
puts in, what the runtime handed out, gave back and marked, and the ownership gate the
runtimes ask before user code (every partition a record arrives from is granted whole on
its first record; ``revoke`` takes slices away as the consumer's revocation does), and the
partitions paused for backpressure. Each test module adds the hand-out guard it needs."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.structs import TopicPartition

from client.fetcher import FetchInterrupted, Item
from client.protocol.keyspace import KeyRange
from client.runtime.gate import Lease, OwnershipGate, Slices


class InMemorySource:
    def __init__(self) -> None:
        self.items: asyncio.Queue[Item] = asyncio.Queue()
        self.handed: list[int] = []
        self.marked: list[int] = []
        self.given_back: list[int] = []
        self.stopped = False
        self.paused: set[TopicPartition] = set()
        self.gate = OwnershipGate(self.session_deadline)
        self._granted: set[TopicPartition] = set()

    def session_deadline(self) -> float:
        return float("inf")

    def may_hand_out(self) -> bool:
        return True

    async def next_item(self, interrupt: asyncio.Future[None]) -> Item:
        getting = asyncio.ensure_future(self.items.get())
        await asyncio.wait({getting, interrupt}, return_when=asyncio.FIRST_COMPLETED)
        if not getting.done():
            getting.cancel()
            raise FetchInterrupted
        item = getting.result()
        self.grant(item[0])
        return item

    def grant(self, tp: TopicPartition) -> None:
        """Grant the whole of ``tp``, once; as the consumer's assignment does before the
        runtime hears of it."""
        if tp not in self._granted:
            self._granted.add(tp)
            self.gate.grant({tp: [KeyRange.full()]})

    def hand_out(self, tp: TopicPartition, record: Any, hashed: int) -> Lease | None:
        self.handed.append(record.offset)
        return self.gate.lease(tp, hashed)

    def give_back(self, record: Any) -> None:
        self.given_back.append(record.offset)

    def mark_processed(self, record: Any) -> None:
        self.marked.append(record.offset)

    def revoke(self, slices: Slices) -> None:
        self.gate.revoke(slices)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.update(partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused.difference_update(partitions)
