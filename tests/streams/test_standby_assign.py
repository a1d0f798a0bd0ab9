"""The assignor's half of standbys against the real broker and coordinator: three
`keyrange streams` instances with one standby replica each, one of them SIGKILLed, and its
key range goes to the instance that kept its standby, whose restore starts from the
standby's offset (docs/streams.md, "Standby key ranges")."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    StreamsProcess,
    TopicReader,
    WordCountRun,
    batch,
    group_members,
    group_settled,
    produce,
    truth_of,
)
from tests.waiting import until

pytestmark = pytest.mark.slow

# Three partition numbers for three instances: each owns one whole number, so the killed
# one's number goes whole to one survivor, which balance lets either be.
PARTITIONS = 3


def member_of(process: StreamsProcess) -> str | None:
    """The member id the process last logged."""
    ids = [
        entry["member_id"] for entry in process.logs if entry.get("msg") == "member epoch changed"
    ]
    return ids[-1] if ids else None


def numbers(member: dict[str, Any], topic: str, field: str = "owned") -> list[int]:
    return sorted(piece["partition"] for piece in member[field] if piece["topic"] == topic)


def on_number(entry: dict[str, Any], number: int) -> bool:
    """Whether a log entry's task (``<sub-topology>_<partition>[<keys>]``) is on ``number``."""
    return str(entry.get("task", "")).split("[")[0].endswith(f"_{number}")


async def test_a_killed_instances_range_goes_to_its_standbys_instance_which_restores_the_tail(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    spawned: list[StreamsProcess],
) -> None:
    lines, words, counts = (
        await make_topic(PARTITIONS),
        await make_topic(PARTITIONS),
        await make_topic(1),
    )
    run = WordCountRun(spawned, kafka_bootstrap, coordinator_url, lines, words, counts)
    run.env["KEYRANGE_STREAMS_NUM_STANDBY_REPLICAS"] = "1"
    processes = [await run.start(tmp_path / name) for name in ("a", "b", "c")]
    await until(
        lambda: group_settled(coordinator_url, run.app_id, 3), 90, "three instances settled"
    )
    produced = batch(0, 300)
    await produce(kafka_bootstrap, lines, produced)
    truth = truth_of(produced)
    async with TopicReader(kafka_bootstrap, counts) as reader:

        async def exact() -> bool:
            await reader.poll()
            return reader.latest() == dict(truth)

        await until(exact, 90, "every word counted")
        by_member = {member_of(process): process for process in processes}
        assert None not in by_member and len(by_member) == 3
        # The standby plan puts a member's standbys on the next member by id; the old rule
        # would give the middle member's orphan to the lowest id, never to the highest.
        lowest, victim_id, holder_id = sorted(str(member_id) for member_id in by_member)
        victim, holder = by_member[victim_id], by_member[holder_id]
        described = {m["member_id"]: m for m in await group_members(coordinator_url, run.app_id)}
        [orphan] = numbers(described[victim_id], words)
        kept = {mid: numbers(described[mid], words) for mid in (lowest, holder_id)}

        def standby_caught_up() -> list[dict[str, Any]]:
            return [
                entry
                for entry in holder.logs
                if entry.get("msg") == "standby caught up"
                and entry.get("store") == "counts"
                and on_number(entry, orphan)
            ]

        async def reported() -> bool:
            members = {m["member_id"]: m for m in await group_members(coordinator_url, run.app_id)}
            return orphan in numbers(members.get(holder_id, {"standbys": []}), words, "standbys")

        await until(lambda: bool(standby_caught_up()), 60, "the holder's standby caught up")
        await until(reported, 30, "the holder's standby reported to the coordinator")
        restores_before = len(holder.restores())

        victim.process.kill()
        await victim.process.wait()

        async def taken_over() -> bool:
            # The description leaves an expired member out before the coordinator reaps it
            # and hands its range on: two members, each owning its target, one the orphan.
            members = await group_members(coordinator_url, run.app_id)
            return (
                len(members) == 2
                and all(numbers(m, words) == numbers(m, words, "target") for m in members)
                and any(orphan in numbers(m, words) for m in members)
            )

        await until(taken_over, 90, "the killed instance's range owned again")
        after = {m["member_id"]: m for m in await group_members(coordinator_url, run.app_id)}
        assert numbers(after[holder_id], words) == sorted([*kept[holder_id], orphan])
        assert numbers(after[holder_id], lines) == numbers(after[holder_id], words)
        assert numbers(after[lowest], words) == kept[lowest]

        more = batch(300, 30)
        await produce(kafka_bootstrap, lines, more)
        truth.update(truth_of(more))

        # At least as often as they occur: what the killed instance processed after its
        # last commit is processed again (at-least-once).
        await until(lambda: reader.counted_at_least(truth), 90, "every word counted after the kill")
    restored = [
        entry
        for entry in holder.restores()[restores_before:]
        if entry["store"] == "counts" and on_number(entry, orphan)
    ]
    assert restored, holder.restores()
    for entry in restored:
        # From the standby's offset: the holder never owned this range, so only its standby
        # can have got it past the changelog's start, and what it read is the tail written
        # since the standby's last read, less than the standby had read already.
        assert entry["start_offset"] > 0, entry
        assert entry["records_read"] < entry["start_offset"], entry
    for process in (holder, by_member[lowest]):
        assert await process.stop(signal.SIGTERM) == 0
