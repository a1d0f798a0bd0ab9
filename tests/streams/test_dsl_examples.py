"""The DSL examples end to end with the real broker and coordinator, against plain-Python
references: the word count (its repartition topic created by the app), orders joined with a
customers table read from its topic, and page views per minute with final results through
scale-out 1 -> 3 -> 2 of `keyrange streams` processes."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from unittest import mock

import httpx
import pytest

from client.streams import StreamsApp
from examples import streams_dsl_orders, streams_dsl_pageviews, streams_dsl_wordcount
from tests.fixtures.coordinator import free_port
from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    StreamsProcess,
    TopicReader,
    accept_range_fetch,
    decode,
    group_owners,
    produce,
    running,
    start_streams,
)
from tests.streams.test_examples import LINES, config
from tests.waiting import until


@pytest.mark.parametrize("cache_max_bytes", [0, 10 * 1024 * 1024])
async def test_the_dsl_word_count_counts_every_word_through_its_repartition_topic(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    cache_max_bytes: int,
) -> None:
    """Without the record cache the count forwards every update; with it (the default) the
    last per key per commit, as Kafka Streams' cached aggregations do: the same latest
    counts, in fewer records."""
    lines, counts = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, lines)
    with mock.patch.dict(os.environ, {"WORDCOUNT_LINES": lines, "WORDCOUNT_COUNTS": counts}):
        topology = streams_dsl_wordcount.build_topology()
    await produce(
        kafka_bootstrap, lines, [(b"l%d" % i, line.encode(), None) for i, line in enumerate(LINES)]
    )
    truth = Counter(word for line in LINES for word in line.split())
    apps = [
        StreamsApp(
            topology,
            config(
                f"dsl-{lines}",
                kafka_bootstrap,
                coordinator_url,
                tmp_path / n,
                cache_max_bytes=cache_max_bytes,
            ),
        )
        for n in ("a", "b")
    ]
    assert f"dsl-{lines}-words-repartition" in apps[0].topology.source_topics
    async with running(apps[0]), running(apps[1]), TopicReader(kafka_bootstrap, counts) as reader:

        async def counted() -> bool:
            await reader.poll()
            return reader.latest() == dict(truth)

        await until(counted, 60, "every word counted")
    if cache_max_bytes:
        assert len(reader.records) <= sum(truth.values())
    else:
        assert len(reader.records) == sum(truth.values())


async def test_orders_meet_the_customers_table_read_from_its_topic(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    orders, customers, output = await make_topic(1), await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, orders, customers)
    env = {"JOIN_ORDERS": orders, "JOIN_CUSTOMERS": customers, "JOIN_OUTPUT": output}
    with mock.patch.dict(os.environ, env):
        topology = streams_dsl_orders.build_topology()
    people = [(f"c{index}", version) for version in (1, 2) for index in range(30)]
    customer_records = [
        (name.encode(), json.dumps({"name": name, "version": version}).encode(), 1_000 + step)
        for step, (name, version) in enumerate(people)
    ]
    order_records = [
        (f"c{index % 36}".encode(), json.dumps({"id": index}).encode(), 5_000 + index)
        for index in range(120)
    ]
    await produce(kafka_bootstrap, customers, customer_records)
    await produce(kafka_bootstrap, orders, order_records)
    table = {key.decode(): json.loads(value) for key, value, _ in customer_records}
    reference = sorted(
        (json.loads(value)["id"], json.dumps(table.get(key.decode()), sort_keys=True))
        for key, value, _ in order_records
    )
    settings = config(
        f"orders-{orders}", kafka_bootstrap, coordinator_url, tmp_path, max_task_idle_ms=2_000
    )
    app = StreamsApp(topology, settings)
    async with running(app), TopicReader(kafka_bootstrap, output) as reader:

        async def joined() -> bool:
            return len(await reader.poll()) >= len(order_records)

        await until(joined, 60, "every order joined")
    result = sorted(
        (
            decode(record.value)["order"]["id"],
            json.dumps(decode(record.value)["customer"], sort_keys=True),
        )
        for record in reader.records
    )
    assert result == reference
    # The table's store wrote no changelog of its own: its topic is the changelog.
    assert f"orders-{orders}-customers-changelog" not in app.topology.source_topics


USERS = [f"u{index}" for index in range(20)]
WINDOW_MS = 1_000
STEP_MS = 20
# Records far past the last window, on many keys: every task's stream time moves past it.
CLOSERS = [f"zz{index}" for index in range(64)]


def views(start: int, count: int) -> list[tuple[bytes, bytes, int]]:
    return [
        (USERS[(index * 7) % len(USERS)].encode(), b"{}", index * STEP_MS)
        for index in range(start, start + count)
    ]


def final_reference(produced: list[tuple[bytes, bytes, int]]) -> dict[tuple[str, int], int]:
    counts: Counter[tuple[str, int]] = Counter()
    for key, _, stamp in produced:
        counts[(key.decode(), stamp // WINDOW_MS * WINDOW_MS)] += 1
    return dict(counts)


@pytest.mark.slow
async def test_final_page_view_windows_equal_the_reference_through_scale_out_one_three_two(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    spawned: list[StreamsProcess],
) -> None:
    source, output = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, source)
    app_id = f"pv-{source}"
    env = {
        "PAGEVIEWS_INPUT": source,
        "PAGEVIEWS_OUTPUT": output,
        "PAGEVIEWS_WINDOW_MS": str(WINDOW_MS),
    }

    async def start(name: str) -> StreamsProcess:
        process = await start_streams(
            "examples.streams_dsl_pageviews:build_topology",
            app_id,
            kafka_bootstrap,
            coordinator_url,
            tmp_path / name,
            env,
        )
        spawned.append(process)
        return process

    async def settled(members: int) -> bool:
        owners = await group_owners(coordinator_url, app_id)
        return len(owners) == members and all(owners)

    produced: list[tuple[bytes, bytes, int]] = []
    async with TopicReader(kafka_bootstrap, output) as reader:

        async def emitted_through(stamp: int) -> bool:
            await reader.poll()
            closed = {key for key in final_reference(produced) if key[1] + WINDOW_MS <= stamp}
            got = {(r.key.decode(), decode(r.value)["start"]) for r in reader.records}
            return closed <= got

        async def feed(start: int, count: int) -> None:
            more = views(start, count)
            produced.extend(more)
            await produce(kafka_bootstrap, source, more)
            # The windows every task has seen close (stream time is per task, so some
            # behind the last stamp): those two windows back.
            await until(
                lambda: emitted_through((start + count) * STEP_MS - 2 * WINDOW_MS),
                90,
                f"closed windows out after {len(produced)} views",
            )

        first = await start("a")
        await until(lambda: settled(1), 60, "one instance owning the partition")
        await feed(0, 300)
        second, third = await start("b"), await start("c")
        await until(lambda: settled(3), 60, "three instances sharing the partition")
        await feed(300, 300)
        assert await third.stop(signal.SIGTERM) == 0
        await until(lambda: settled(2), 60, "two instances after a graceful stop")
        await feed(600, 300)
        end = 900 * STEP_MS + 10 * WINDOW_MS
        await produce(kafka_bootstrap, source, [(key.encode(), b"{}", end) for key in CLOSERS])
        reference = final_reference(produced)

        async def complete() -> bool:
            await reader.poll()
            return {(r.key.decode(), decode(r.value)["start"]) for r in reader.records} >= set(
                reference
            )

        await until(complete, 90, "every window's final result")
        for process in (first, second):
            assert await process.stop(signal.SIGTERM) == 0
    emitted = [
        (record.key.decode(), decode(record.value)["start"], decode(record.value)["views"])
        for record in reader.records
    ]
    windows = [(key, start) for key, start, _ in emitted]
    assert len(windows) == len(set(windows)), "a final result emitted twice"
    assert {(key, start): count for key, start, count in emitted} == reference
    assert not [key for key, _ in windows if key.startswith("zz")]


@pytest.mark.slow
async def test_after_a_sigkill_every_final_window_comes_out_and_repeats_are_measured(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    spawned: list[StreamsProcess],
) -> None:
    source, output = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, source)
    app_id = f"pvk-{source}"
    env = {
        "PAGEVIEWS_INPUT": source,
        "PAGEVIEWS_OUTPUT": output,
        "PAGEVIEWS_WINDOW_MS": str(WINDOW_MS),
        # 5 ms a view: the kill lands mid-stream.
        "PAGEVIEWS_LOOKUP_MS": "5",
    }
    processes = []
    for name in ("a", "b"):
        process = await start_streams(
            "examples.streams_dsl_pageviews:build_topology",
            app_id,
            kafka_bootstrap,
            coordinator_url,
            tmp_path / name,
            env,
        )
        spawned.append(process)
        processes.append(process)

    async def settled() -> bool:
        owners = await group_owners(coordinator_url, app_id)
        return len(owners) == 2 and all(owners)

    await until(settled, 60, "two instances sharing the partition")
    produced = views(0, 900)
    end = 900 * STEP_MS + 10 * WINDOW_MS
    await produce(kafka_bootstrap, source, produced)
    await produce(kafka_bootstrap, source, [(key.encode(), b"{}", end) for key in CLOSERS])
    reference = final_reference(produced)
    async with TopicReader(kafka_bootstrap, output) as reader:

        async def some_emitted() -> bool:
            return len(await reader.poll()) > 40

        await until(some_emitted, 60, "final windows under way")
        processes[0].process.kill()
        await processes[0].process.wait()
        assert len(reader.records) < len(reference)

        async def complete() -> bool:
            await reader.poll()
            return {(r.key.decode(), decode(r.value)["start"]) for r in reader.records} >= set(
                reference
            )

        await until(complete, 120, "every window's final result after the kill")
        assert await processes[1].stop(signal.SIGTERM) == 0
    emitted = Counter((r.key.decode(), decode(r.value)["start"]) for r in reader.records)
    repeated = sum(count - 1 for count in emitted.values())
    print(f"\nfinal windows emitted again after SIGKILL: {repeated} of {len(reference)}")
    # A repeat is a window emitted but not marked final in the changelog when the instance
    # died: at most what one commit interval closed.
    assert repeated < len(reference) // 2


async def test_a_window_store_answers_the_query_routes_with_each_windows_start_and_end(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """The HTTP queries' window routes over a DSL window store (docs/api.md, "Streams
    instances"): one key's windows, a key range's, and a key-range scan refused."""
    source, output = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, source)
    environ = {
        "PAGEVIEWS_INPUT": source,
        "PAGEVIEWS_OUTPUT": output,
        "PAGEVIEWS_WINDOW_MS": str(WINDOW_MS),
    }
    with mock.patch.dict(os.environ, environ):
        topology = streams_dsl_pageviews.build_topology()
    produced = views(0, 60)
    await produce(kafka_bootstrap, source, produced)
    truth = final_reference(produced)
    port = free_port()
    app = StreamsApp(
        topology,
        config(f"pv-{source}", kafka_bootstrap, coordinator_url, tmp_path, query_port=port),
    )
    user = USERS[0]
    expected = sorted(
        (start, start + WINDOW_MS, count) for (key, start), count in truth.items() if key == user
    )
    base = f"http://127.0.0.1:{port}/v1/stores/views-per-window"
    async with running(app), httpx.AsyncClient(timeout=10) as http:

        async def windows_of_user() -> list[tuple[int, int, int]]:
            try:
                reply = await http.get(f"{base}/keys/{user}/windows")
            except httpx.TransportError:
                return []  # the instance is not serving yet
            if reply.status_code != 200:
                return []
            rows = reply.json()["windows"]
            found = sorted((row["start"], row["end"], row["value"]) for row in rows)
            return found if found == expected else []

        await until(windows_of_user, 60, "the user's windows, counted")
        every_window = {(key, start, start + WINDOW_MS) for key, start in truth}

        async def every_window_scanned() -> bool:
            # Key-byte order: "u0" to "u9" holds u0 ... u19. The other users' windows may
            # still be counting when the first user's are done.
            scanned = await http.get(f"{base}/windows", params={"from": "u0", "to": "u9"})
            # Without key bounds: every key's windows (docs/api.md allows both).
            unbounded = await http.get(f"{base}/windows")
            return all(
                {(row["key"], row["start"], row["end"]) for row in reply.json()["entries"]}
                == every_window
                for reply in (scanned, unbounded)
            )

        await until(every_window_scanned, 60, "every user's windows, in a key-range scan")
        refused = await http.get(f"{base}/range")
    assert (refused.status_code, refused.json()["error"]) == (400, "NOT_A_KEY_VALUE_STORE")
