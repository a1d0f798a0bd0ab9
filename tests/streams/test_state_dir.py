"""Instances on one host never share a store directory (issue 47 item 1: two instances on the
default ``--state-dir`` broke each other on RocksDB's lock)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from client.streams.state_dir import StateDirectory, StateDirectoryInUse
from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    ROOT,
    StreamsProcess,
    TopicReader,
    accept_range_fetch,
    group_settled,
    produce,
    start_streams,
)
from tests.waiting import until


def test_instances_side_by_side_take_directories_of_their_own(tmp_path: Path) -> None:
    first, second = StateDirectory(tmp_path, None), StateDirectory(tmp_path, None)
    try:
        assert first.claim() == tmp_path / "instance-0"
        assert second.claim() == tmp_path / "instance-1"
    finally:
        first.release()
        second.release()
    # Started one after another, an instance finds its directory (and checkpoints) again.
    again = StateDirectory(tmp_path, None)
    assert again.claim() == tmp_path / "instance-0"
    again.release()


def test_an_instance_id_in_use_is_refused_naming_the_directory_and_the_options(
    tmp_path: Path,
) -> None:
    holder = StateDirectory(tmp_path, "pod/7")
    assert holder.claim() == tmp_path / "id-pod_7"
    try:
        with pytest.raises(StateDirectoryInUse) as refused:
            StateDirectory(tmp_path, "pod/7").claim()
    finally:
        holder.release()
    message = str(refused.value)
    assert str(tmp_path / "id-pod_7") in message
    assert "--instance-id" in message and "--state-dir" in message


async def test_two_processes_with_one_instance_id_the_second_exits_2_before_joining(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    holder = StateDirectory(tmp_path / "twin", "a")
    holder.claim()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "client.cli",
            "streams",
            "examples.streams_wordcount:build_topology",
            "--application-id",
            "twin",
            "--instance-id",
            "a",
            "--bootstrap",
            kafka_bootstrap,
            "--coordinator",
            coordinator_url,
            "--state-dir",
            str(tmp_path),
            cwd=ROOT,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            _, stderr = await process.communicate()
    finally:
        holder.release()
    lines = stderr.decode().strip().splitlines()
    assert process.returncode == 2, lines
    assert lines[-1].startswith("keyrange streams: the state directory"), lines
    assert "is in use by another instance" in lines[-1]


async def test_two_instances_on_the_default_directory_both_count(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    spawned: list[StreamsProcess],
) -> None:
    lines, words, counts = await make_topic(1), await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, lines, words)
    env = {"WORDCOUNT_LINES": lines, "WORDCOUNT_WORDS": words, "WORDCOUNT_COUNTS": counts}
    application_id = f"twins-{lines}"
    for _ in range(2):
        spawned.append(
            await start_streams(
                "examples.streams_wordcount:build_topology",
                application_id,
                kafka_bootstrap,
                coordinator_url,
                tmp_path,
                env,
            )
        )
    await until(
        lambda: group_settled(coordinator_url, application_id, 2), 90, "two instances settled"
    )
    sentence = b"alpha beta gamma delta epsilon zeta eta theta iota kappa"
    await produce(kafka_bootstrap, lines, [(b"l%d" % n, sentence, None) for n in range(20)])
    truth = {word.decode(): 20 for word in sentence.split()}
    async with TopicReader(kafka_bootstrap, counts) as reader:

        async def counted() -> bool:
            await reader.poll()
            return reader.latest() == truth

        await until(counted, 90, "every word counted by the two instances")
    assert sorted(p.name for p in (tmp_path / application_id).iterdir()) == [
        "instance-0",
        "instance-1",
    ]
    for process in spawned:
        assert process.process.returncode is None, process.text()
