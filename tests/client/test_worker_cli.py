"""``keyrange worker`` as a process: options from flags and environment variables, clear
errors for bad ones, and the shutdown a container platform sends (SIGTERM: finish, commit,
leave; a second signal: exit at once)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.client.test_consumer import produce
from tests.client.test_worker import KEYS, processed_offsets
from tests.fixtures.services import MakeTopic
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]


async def start_worker(
    target: str, journal: Path, env: dict[str, str], *argv: str
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client.cli",
        "worker",
        target,
        *argv,
        cwd=ROOT,
        env={**os.environ, "WORKER_TEST_JOURNAL": str(journal), **env},
        stderr=asyncio.subprocess.PIPE,
    )


def events(journal: Path) -> list[str]:
    return journal.read_text().splitlines() if journal.exists() else []


def worker_env(topic: str, group_id: str, bootstrap: str, coordinator: str) -> dict[str, str]:
    return {
        "KEYRANGE_WORKER_TOPICS": topic,
        "KEYRANGE_WORKER_GROUP": group_id,
        "KEYRANGE_WORKER_BOOTSTRAP": bootstrap,
        "KEYRANGE_WORKER_COORDINATOR": coordinator,
        "KEYRANGE_WORKER_SESSION_TIMEOUT_MS": "3000",
        "KEYRANGE_WORKER_COMMIT_INTERVAL_MS": "200",
    }


async def members(coordinator: str, group_id: str) -> int:
    async with httpx.AsyncClient(base_url=coordinator) as api:
        reply = await api.get(f"/v1/admin/groups/{group_id}")
        reply.raise_for_status()
        return len(reply.json()["members"])


async def test_sigterm_finishes_the_record_in_processing_commits_and_leaves(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:10])
    group_id = f"cli-{uuid.uuid4().hex[:8]}"
    journal = tmp_path / "journal"
    env = worker_env(topic, group_id, kafka_bootstrap, coordinator_url)
    # Flags win over variables: the group comes from the flag.
    env["KEYRANGE_WORKER_GROUP"] = "not-this-one"
    process = await start_worker(
        "tests.client.worker_targets:Journaling",
        journal,
        {**env, "WORKER_TEST_SLOW": "9=3"},
        "--group",
        group_id,
        "--subpartitions",
        "2",
    )
    try:
        await until(lambda: "start 9" in events(journal), 60, "the slow record to start")
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0, stderr.decode()
    seen = events(journal)
    assert "done 9" in seen
    assert seen.count("closed") == 2
    assert await processed_offsets(coordinator_url, group_id, topic) == set(range(10))
    assert await members(coordinator_url, group_id) == 0


async def test_a_second_signal_exits_at_once_without_waiting_for_the_record(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:3])
    group_id = f"cli-{uuid.uuid4().hex[:8]}"
    journal = tmp_path / "journal"
    process = await start_worker(
        "tests.client.worker_targets:handle",
        journal,
        {
            **worker_env(topic, group_id, kafka_bootstrap, coordinator_url),
            "WORKER_TEST_SLOW": "1=600",
        },
    )
    try:
        await until(lambda: "start 1" in events(journal), 60, "the slow record to start")
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode in (-signal.SIGINT, -signal.SIGTERM)
    assert "done 1" not in events(journal)
    assert 1 not in await processed_offsets(coordinator_url, group_id, topic)


# A target and every required option, so a case fails on the option it adds.
REQUIRED_OPTIONS = (
    "tests.client.worker_targets:handle",
    "--topics",
    "t",
    "--group",
    "g",
    "--bootstrap",
    "b",
    "--coordinator",
    "http://c",
)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "missing the target"),
        (("tests.client.worker_targets:nothing",), "has no nothing"),
        (("tests.client.worker_targets:NOT_CALLABLE",), "neither a WorkerTask"),
        (("tests.client.worker_targets:handle",), "missing --topics"),
        ((*REQUIRED_OPTIONS, "--failure-policy", "never"), "failure_policy must be one of"),
        (
            (*REQUIRED_OPTIONS, "--coordinator", "127.0.0.1:8080"),
            "coordinator URL '127.0.0.1:8080' is not an http:// or https:// URL",
        ),
        (
            (*REQUIRED_OPTIONS, "--kafka-security-protocol", "SASL_SSL"),
            "needs kafka_sasl_mechanism",
        ),
        ((*REQUIRED_OPTIONS, "--kafka-ssl-cafile", "/nonexistent/ca.pem"), "does not use TLS"),
        ((*REQUIRED_OPTIONS, "--kafka-security-protocol", "KERBEROS"), "is not one of PLAINTEXT"),
        (
            (*REQUIRED_OPTIONS, "--kafka-ssl-check-hostname", "maybe"),
            "--kafka-ssl-check-hostname: invalid value",
        ),
    ],
)
async def test_bad_options_are_one_line_and_exit_code_2(
    argv: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client.cli",
        "worker",
        *argv,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("KEYRANGE_WORKER_")},
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    lines = stderr.decode().strip().splitlines()
    assert process.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("keyrange worker: ") and message in lines[0]


async def test_an_unreachable_broker_is_one_line_and_exit_code_1(
    tmp_path: Path, coordinator_url: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client.cli",
        "worker",
        "tests.client.worker_targets:handle",
        "--topics",
        "t",
        "--group",
        "g",
        "--bootstrap",
        "127.0.0.1:1",
        "--coordinator",
        coordinator_url,
        "--log-level",
        "CRITICAL",
        cwd=ROOT,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        _, stderr = await process.communicate()
    lines = stderr.decode().strip().splitlines()
    assert process.returncode == 1
    assert len(lines) == 1 and lines[0].startswith("keyrange worker: KafkaConnectionError")
