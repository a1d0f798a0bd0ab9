"""The dead-letter topic: records that failed ``max_attempts`` times go there, with headers
naming their origin, and count as processed only once the broker acknowledged them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer

from client.fetcher import Record
from client.worker.failures import FailureHistory, dead_letter_headers

logger = logging.getLogger(__name__)


class DeadLetters:
    """One producer per worker process (shared by every task), started on first use."""

    def __init__(self, topic: str, producer_options: Mapping[str, Any]) -> None:
        self.topic = topic
        # Every in-sync replica has the dead letter before its record counts as processed.
        self._options = {"acks": "all", **producer_options}
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()

    async def send(self, record: Record, key_hash: int, history: FailureHistory) -> None:
        """Returns once the broker acknowledged the dead letter; raises if it did not."""
        producer = await self._started()
        headers = dead_letter_headers(
            record.topic,
            record.partition,
            record.offset,
            record.timestamp,
            key_hash,
            history,
            list(record.headers or ()),
        )
        delivered = await producer.send(
            self.topic, value=record.value, key=record.key, headers=headers
        )
        metadata = await delivered
        logger.warning(
            "record dead-lettered",
            extra={
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "attempts": history.attempts,
                "error_type": type(history.error).__name__,
                "dead_letter_topic": self.topic,
                "dead_letter_partition": metadata.partition,
                "dead_letter_offset": metadata.offset,
            },
        )

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def _started(self) -> AIOKafkaProducer:
        async with self._starting:
            if self._producer is None:
                producer = AIOKafkaProducer(**self._options)
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()
                    raise
                self._producer = producer
            return self._producer
