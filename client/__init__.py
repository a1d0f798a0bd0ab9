"""Keyrange client SDK: consume Kafka partitions shared by key range, commit to the coordinator.

Group mode (the coordinator assigns slices; more members than partitions is fine)::

    import asyncio
    from client import KeyrangeConsumer

    async def main() -> None:
        async with KeyrangeConsumer(
            "orders",
            bootstrap_servers="localhost:9092",
            coordinator_url="http://localhost:8080",
            group_id="billing",
        ) as consumer:
            async for record in consumer:  # marked processed when the next one is requested
                print(record.partition, record.offset, record.key, record.value)

    asyncio.run(main())

Concurrent processing, each key one record at a time in offset order::

    async def handle(record) -> None:
        ...

    async with KeyrangeConsumer("orders", ...) as consumer:
        await consumer.run(handle, max_concurrency=32)

Standalone (no membership; commits are accepted only while the group has no live members)::

    async with KeyrangeConsumer(bootstrap_servers=..., coordinator_url=..., group_id="fill") as c:
        c.assign({TopicPartition("orders", 0): KeyRange.full().split(4)[:2]})
        batch = await c.getmany(timeout_ms=500)
        for records in batch.values():
            for record in records:
                ...
            c.mark_all_processed(records)  # or c.mark_processed(record) for each one
        await c.commit()

A member past its session deadline (frozen, or its event loop blocked) hands nothing more
out and rejoins; ``run`` cancels its running handlers (``cancel_on_loss=False`` lets them
finish), and a handler asks ``consumer.still_owned(record)`` right before a side effect::

    async def handle(record) -> None:
        result = await compute(record)
        if consumer.still_owned(record):
            await store(result, fence=record.offset)

``mark_all_processed`` marks a partition's batch, processed in offset order, in one step
(much cheaper than a call per record); other lists of records are marked one by one.
"""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from client import errors
from client.consumer import ConsumerStopped, KeyrangeConsumer, RebalanceListener
from client.errors import KeyrangeClientError
from client.http import (
    CoordinatorClient,
    HeartbeatReply,
    HeartbeatRequest,
    IdleNotice,
    PartitionCommit,
    PartitionCommitReply,
)
from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import KeyRange, key_hash

__all__ = [
    "CommittedOffsets",
    "ConsumerStopped",
    "CoordinatorClient",
    "HeartbeatReply",
    "HeartbeatRequest",
    "IdleNotice",
    "KeyRange",
    "KeyrangeClientError",
    "KeyrangeConsumer",
    "PartitionCommit",
    "PartitionCommitReply",
    "RebalanceListener",
    "TopicPartition",
    "Watermark",
    "errors",
    "key_hash",
]
