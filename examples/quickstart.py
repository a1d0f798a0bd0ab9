"""Two consumers share one partition by key range, each key in offset order.

Run it against a running coordinator (`make run` serves the broker on 127.0.0.1:9092):

    .venv/bin/python -m examples.quickstart --bootstrap 127.0.0.1:9092 \
        --coordinator http://127.0.0.1:8080

Both members wait until the coordinator has split the partition's key space between them
before either starts working, so the output shows the sharing on any machine, fast or slow.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import uuid
from collections import Counter

import httpx
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord

from client import KeyRange, KeyrangeConsumer

RECORDS = 200
MEMBERS = ("alice", "bob")
WHOLE = KeyRange.full().size


def share_of_key_space(consumer: KeyrangeConsumer) -> float:
    owned = sum(keys.size for ranges in consumer.assignment().values() for keys in ranges)
    return owned / WHOLE


def describe(name: str, consumer: KeyrangeConsumer) -> str:
    ranges = ", ".join(
        f"{keys.start}..{keys.end}" for ranges in consumer.assignment().values() for keys in ranges
    )
    return f"{name} owns key hashes {ranges} ({share_of_key_space(consumer):.0%} of the key space)"


async def consume(
    name: str,
    topic: str,
    args: argparse.Namespace,
    seen: Counter[str],
    everyone_has_a_share: asyncio.Barrier,
    done: asyncio.Event,
) -> None:
    async with KeyrangeConsumer(
        topic,
        bootstrap_servers=args.bootstrap,
        coordinator_url=args.coordinator,
        group_id=f"quickstart-{topic}",
        session_timeout_ms=3_000,
    ) as consumer:
        # Wait for the assignment, not for time: until this member owns part of the key
        # space and not all of it, which means the other member has joined and owns the rest.
        while not 0 < share_of_key_space(consumer) < 1:
            await consumer.wait_for_assignment()
            await asyncio.sleep(0.05)
        print(describe(name, consumer), flush=True)
        await everyone_has_a_share.wait()

        async def handle(record: ConsumerRecord[bytes, bytes]) -> None:
            await asyncio.sleep(0.02)  # the work; records of one key never overlap
            seen[name] += 1
            if sum(seen.values()) >= RECORDS:
                done.set()

        worker = asyncio.create_task(consumer.run(handle, max_concurrency=8))
        await done.wait()
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    # Leaving the context commits what was processed and leaves the group.


async def main(args: argparse.Namespace) -> None:
    topic = f"quickstart-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    async with AIOKafkaProducer(bootstrap_servers=args.bootstrap) as producer:
        for i in range(RECORDS):
            await producer.send_and_wait(
                topic, key=f"user-{i % 20}".encode(), value=str(i).encode()
            )
    # One partition may only be split when its topic allows it (accept.range.fetch).
    async with httpx.AsyncClient(base_url=args.coordinator) as http:
        reply = await http.put(
            f"/v1/admin/topics/{topic}/config", json={"accept_range_fetch": True}
        )
        reply.raise_for_status()
    seen: Counter[str] = Counter()
    done = asyncio.Event()
    everyone_has_a_share = asyncio.Barrier(len(MEMBERS))
    await asyncio.wait_for(
        asyncio.gather(
            *(consume(name, topic, args, seen, everyone_has_a_share, done) for name in MEMBERS)
        ),
        timeout=60,
    )
    print(f"processed {sum(seen.values())} records of one partition: {dict(seen)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--coordinator", default="http://127.0.0.1:8080")
    asyncio.run(main(parser.parse_args()))
