"""The record feed the engine tests drive an engine with, without Kafka: records the test
puts in, and what the engine handed out and marked. Each test module adds the hand-out
guard it needs."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.structs import TopicPartition

from client.fetcher import FetchInterrupted, Item


class InMemorySource:
    def __init__(self) -> None:
        self.items: asyncio.Queue[Item] = asyncio.Queue()
        self.handed: list[int] = []
        self.marked: list[int] = []
        self.stopped = False

    async def next_item(self, interrupt: asyncio.Future[None]) -> Item:
        getting = asyncio.ensure_future(self.items.get())
        await asyncio.wait({getting, interrupt}, return_when=asyncio.FIRST_COMPLETED)
        if not getting.done():
            getting.cancel()
            raise FetchInterrupted
        return getting.result()

    def hand_out(self, tp: TopicPartition, record: Any, hashed: int) -> None:
        self.handed.append(record.offset)

    def mark_processed(self, record: Any) -> None:
        self.marked.append(record.offset)
