"""The README's worker section as a newcomer runs it: a topic and records from `keyrange
topic`, then `keyrange worker examples.billing:Billing`, which processes every record and stops
cleanly on SIGTERM (issue 47 item 3: the module it named did not exist)."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import uuid
from pathlib import Path

from aiokafka.structs import TopicPartition

from client.http import CoordinatorClient
from client.protocol.keyspace import key_hash
from tests.client.test_topic_command import keyrange_topic
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


async def processed(coordinator: str, group_id: str, topic: str, count: int, keys: int) -> int:
    async with CoordinatorClient(coordinator) as api:
        state = (await api.fetch_offsets(group_id, [topic])).get(TopicPartition(topic, 0))
    if state is None:
        return 0
    return sum(
        state.is_processed(offset, key_hash(b"key-%d" % (offset % keys), offset))
        for offset in range(count)
    )


async def test_the_readme_worker_processes_every_record(
    kafka_bootstrap: str, coordinator_url: str
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    group_id = f"billing-{topic}"
    assert (await keyrange_topic("create", topic, "--bootstrap", kafka_bootstrap))[0] == 0
    produced = await keyrange_topic(
        "produce", topic, "--count", "300", "--keys", "30", "--bootstrap", kafka_bootstrap
    )
    assert produced[0] == 0, produced[2]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client.cli",
        "worker",
        "examples.billing:Billing",
        "--topics",
        topic,
        "--group",
        group_id,
        "--coordinator",
        coordinator_url,
        "--bootstrap",
        kafka_bootstrap,
        "--failure-policy",
        "retry",
        "--commit-interval-ms",
        "200",
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    try:

        async def all_processed() -> bool:
            return await processed(coordinator_url, group_id, topic, 300, 30) == 300

        await until(all_processed, 90, "every order billed and committed")
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0, stderr.decode()
    said = stderr.decode()
    assert "billing closed" in said
    # Issue 47 item 6: a worker says when it started and when it stopped.
    assert "worker started" in said and group_id in said
    assert said.index("worker started") < said.index("worker stopped")


def test_the_readme_names_the_example_and_the_topic_commands() -> None:
    text = README.read_text()
    assert "keyrange worker examples.billing:Billing" in text
    assert re.search(r"keyrange topic create orders", text)
    assert re.search(r"keyrange topic produce orders", text)
