"""Adding or removing a streams instance moves the fewest key ranges (the sticky-join
assignor's stickiness, docs/design.md §6), seen through real `keyrange streams` processes on a
one-partition topic: what moves is what a state store has to restore, so every range moved
without need is state read again from the changelog, and every survivor that kept its
ranges keeps its store as it was."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from client.protocol.keyspace import HASH_MAX, HASH_SPACE, KeyRange, normalize, subtract
from coordinator.core.assignors.sticky_join import TILES_PER_MEMBER
from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    StreamsProcess,
    TopicReader,
    WordCountRun,
    batch,
    group_members,
    produce,
    truth_of,
    wordcount_topics,
)
from tests.waiting import until

pytestmark = pytest.mark.slow

# Per instance id, per (topic, partition): the key ranges it owns, normalized.
Ownership = dict[str, dict[tuple[str, int], list[KeyRange]]]


def slices(described: list[dict[str, Any]]) -> dict[tuple[str, int], list[KeyRange]]:
    return {
        (piece["topic"], piece["partition"]): normalize(
            KeyRange.from_json(pair) for pair in piece["ranges"]
        )
        for piece in described
    }


def size(ranges: list[KeyRange]) -> int:
    return sum(keys.size for keys in ranges)


class Group:
    """The word count's group as the coordinator describes it, by instance id."""

    def __init__(self, run: WordCountRun, topics: tuple[str, ...]) -> None:
        self._run = run
        self._topics = topics
        self.owned: Ownership = {}

    async def settled(self, instances: set[str]) -> bool:
        """Exactly these instances, each owning its target, together owning every hash of
        every topic once: no hand-off under way."""
        members = await group_members(self._run.coordinator, self._run.app_id)
        owned = {member["instance_id"]: slices(member["owned"]) for member in members}
        targets = {member["instance_id"]: slices(member["target"]) for member in members}
        if len(members) != len(instances) or set(owned) != instances or owned != targets:
            return False
        for topic in self._topics:
            ranges = [keys for mine in owned.values() for keys in mine.get((topic, 0), [])]
            if size(ranges) != HASH_SPACE or normalize(ranges) != [KeyRange(0, HASH_MAX)]:
                return False
        self.owned = owned
        return True


class Counts:
    """Feeds lines and waits for the counts to be exact."""

    def __init__(self, run: WordCountRun, reader: TopicReader) -> None:
        self._run = run
        self._reader = reader
        self.produced: list[tuple[bytes, bytes, None]] = []

    async def feed(self, count: int) -> None:
        more = batch(len(self.produced), count)
        self.produced.extend(more)
        await produce(self._run.bootstrap, self._run.lines, more)
        truth = dict(truth_of(self.produced))

        async def exact() -> bool:
            await self._reader.poll()
            return self._reader.latest() == truth

        await until(exact, 90, f"exact counts after {len(self.produced)} lines")


async def test_adding_then_removing_an_instance_moves_only_the_ranges_it_takes_or_gives_up(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    spawned: list[StreamsProcess],
) -> None:
    lines, words, counts = await wordcount_topics(make_topic, coordinator_url)
    run = WordCountRun(spawned, kafka_bootstrap, coordinator_url, lines, words, counts)
    group = Group(run, (lines, words))
    async with TopicReader(kafka_bootstrap, counts) as reader:
        counting = Counts(run, reader)
        a = await run.start(tmp_path / "a", "a")
        b = await run.start(tmp_path / "b", "b")
        await until(lambda: group.settled({"a", "b"}), 60, "a and b sharing the partition")
        await counting.feed(60)
        changelog = sum(truth_of(counting.produced).values())
        two = group.owned
        restored_before = {"a": len(a.restores()), "b": len(b.restores())}

        # Scale out: c takes its share from a and b, and a and b trade nothing.
        c = await run.start(tmp_path / "c", "c")
        await until(lambda: group.settled({"a", "b", "c"}), 60, "a, b and c sharing it")
        three = group.owned
        for topic in (lines, words):
            tp = (topic, 0)
            given_up = {name: subtract(two[name][tp], three[name][tp]) for name in "ab"}
            for name in "ab":
                assert subtract(three[name][tp], two[name][tp]) == [], (name, two, three)
            assert three["c"][tp] == normalize(given_up["a"] + given_up["b"]), (two, three)
            # The fewest moved: c's share, a third of the key space to one tile of a grid of
            # at least TILES_PER_MEMBER tiles per member.
            shares = [size(three[name][tp]) for name in "abc"]
            assert max(shares) - min(shares) <= HASH_SPACE // (3 * TILES_PER_MEMBER), shares
        await counting.feed(60)

        # Survivors read on from what they held and wrote nothing again; c restored its
        # share only, from a changelog holding every key.
        for name, process in (("a", a), ("b", b)):
            again = process.restores()[restored_before[name] :]
            assert all(entry["records_restored"] == 0 for entry in again), (name, again)
        joined = c.restores()
        assert joined and all(
            entry["records_restored"] < entry["records_read"] for entry in joined
        ), joined
        assert 0 < sum(entry["records_restored"] for entry in joined) < changelog, joined

        # Scale in: a leaves; b and c keep all they had and share out a's ranges only.
        assert await a.stop(signal.SIGTERM) == 0
        await until(lambda: group.settled({"b", "c"}), 60, "b and c after a left")
        two_again = group.owned
        for topic in (lines, words):
            tp = (topic, 0)
            gained = {name: subtract(two_again[name][tp], three[name][tp]) for name in "bc"}
            for name in "bc":
                assert subtract(three[name][tp], two_again[name][tp]) == [], (three, two_again)
            assert normalize(gained["b"] + gained["c"]) == three["a"][tp], (three, two_again)
        await counting.feed(60)
        # One output record per word occurrence: nothing was counted twice on the way.
        assert len(reader.records) == sum(truth_of(counting.produced).values())
        for process in (b, c):
            assert await process.stop(signal.SIGTERM) == 0
