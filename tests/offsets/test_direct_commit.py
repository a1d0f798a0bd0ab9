"""Commits the HTTP protocol answers itself (coordinator/offsets/direct.py), over real sockets
to a coordinator served as ``keyrange serve`` serves it, on a real migrated Postgres.

The oracle is the ASGI path on the same server: a chunked body (Transfer-Encoding) always
goes there, so each request is sent both ways and must get the same answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator.app import create_app
from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator, settings_for_tests
from tests.raw_http import exchange, read_reply, request_bytes
from tests.waiting import until


@pytest_asyncio.fixture(scope="module")
async def database(make_migrated_database: MakeDatabase) -> str:
    return await make_migrated_database()


@pytest_asyncio.fixture(scope="module")
async def served(database: str) -> AsyncIterator[RunningCoordinator]:
    settings = settings_for_tests(max_partitions_per_request=3, max_ic_ranges_per_partition=3)
    coordinator = RunningCoordinator(create_app(settings, database))
    await coordinator.start()
    yield coordinator
    await coordinator.stop()


def commit_request(group: str, body: bytes, **options: Any) -> bytes:
    return request_bytes(f"/v1/groups/{group}/offsets/commit", body, **options)


def entry(partition: int, low: int, high: int, **extra: Any) -> dict[str, Any]:
    return {"topic": "orders", "partition": partition, "ranges": [[low, high]], **extra}


def body_of(*entries: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps({"partitions": list(entries), **fields}).encode()


CASES: list[tuple[str, bytes, dict[str, Any]]] = [
    ("a first commit", body_of(entry(0, 0, 4), entry(1, 2, 3)), {}),
    ("a commit after it", body_of(entry(0, 5, 9)), {}),
    ("a duplicate", body_of(entry(0, 1, 2)), {}),
    (
        "three ranges apart",
        body_of({"topic": "orders", "partition": 5, "ranges": [[10, 10], [20, 20], [30, 30]]}),
        {},
    ),
    ("a fourth, over the cap", body_of(entry(5, 40, 40)), {}),
    ("malformed JSON", b'{"partitions": [', {}),
    ("an unknown field", body_of(entry(0, 10, 11, colour="red")), {}),
    ("start after end", body_of(entry(0, 12, 11)), {}),
    ("over the partitions limit", body_of(*(entry(p, 0, 1) for p in range(4))), {}),
    ("a member without its epoch", body_of(entry(2, 0, 1), member_id="m-1"), {}),
    (
        "a member the group does not know",
        body_of(entry(2, 0, 1), member_id="m", member_epoch=3),
        {},
    ),
    ("text, not JSON", body_of(entry(3, 0, 1)), {"content_type": b"text/plain"}),
    ("a group id the path refuses", body_of(entry(3, 0, 1)), {"group": "bad%20group"}),
]


@pytest.mark.parametrize(("case", "body", "options"), CASES, ids=[case[0] for case in CASES])
async def test_each_request_gets_the_answer_the_asgi_path_gives(
    served: RunningCoordinator,
    case: str,
    body: bytes,
    options: dict[str, Any],
    asgi_calls: list[str],
) -> None:
    content_type = options.get("content_type", b"application/json")
    suffix = options.get("group")
    direct_group = suffix or "direct-oracle"
    asgi_group = suffix or "asgi-oracle"
    (direct,) = await exchange(
        served.port, commit_request(direct_group, body, content_type=content_type)
    )
    (asgi,) = await exchange(
        served.port, commit_request(asgi_group, body, content_type=content_type, chunked=True)
    )
    # The two groups differ only in name, which replies name.
    asgi_body = asgi[2].replace(asgi_group.encode(), direct_group.encode())
    assert (direct[0], direct[2]) == (asgi[0], asgi_body), case
    assert direct[1]["content-type"] == asgi[1]["content-type"]
    assert "date" in direct[1] and "server" in direct[1]
    # A request refused before the batcher (all of these with 400) is handed to the ASGI
    # application; what the batcher decided never reaches it (the ASGI twin always does).
    assert len(asgi_calls) == (2 if direct[0] == 400 else 1)


async def test_a_commit_over_the_cap_flags_its_group_for_a_rebalance(
    served: RunningCoordinator, database: str
) -> None:
    """After the oracle cases: the direct twin's group is flagged as the ASGI twin's is."""
    engine = create_async_engine(database)
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(
                text("SELECT group_id, rebalance_requested FROM groups ORDER BY group_id")
            )
            flagged = {row.group_id: row.rebalance_requested for row in rows}
    finally:
        await engine.dispose()
    assert flagged["direct-oracle"] is True
    assert flagged["asgi-oracle"] is True


async def test_commits_in_one_write_are_answered_in_order(
    served: RunningCoordinator, asgi_calls: list[str]
) -> None:
    replies = await exchange(
        served.port,
        commit_request("pipelined", body_of(entry(0, 0, 9))),
        commit_request("pipelined", body_of(entry(0, 10, 19))),
        b"GET /v1/groups/pipelined/offsets HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        commit_request("pipelined", body_of(entry(0, 20, 29))),
    )
    assert [status for status, _, _ in replies] == [200, 200, 200, 200]
    stored = json.loads(replies[2][2])["partitions"]
    assert [(p["partition"], p["stable_offset"]) for p in stored] == [(0, 20)]
    async with httpx.AsyncClient(base_url=served.url) as client:
        final = (await client.get("/v1/groups/pipelined/offsets")).json()["partitions"]
    assert final[0]["stable_offset"] == 30
    # The first commit was answered directly; what followed it in the same write queued
    # behind it and went the ASGI way, as uvicorn serves pipelined requests.
    assert asgi_calls[0].endswith("/offsets/commit")


async def test_a_commit_whose_client_left_is_still_stored_and_the_server_serves_on(
    served: RunningCoordinator,
) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(commit_request("left", body_of(entry(0, 0, 6))))
    await writer.drain()
    writer.close()
    async with httpx.AsyncClient(base_url=served.url) as client:

        async def stored() -> bool:
            reply = await client.get("/v1/groups/left/offsets")
            partitions = reply.json()["partitions"] if reply.status_code == 200 else []
            return [p["stable_offset"] for p in partitions] == [7]

        await until(stored, timeout_s=10, what="the commit of a client that left")
        again = await client.post(
            "/v1/groups/left/offsets/commit", json={"partitions": [entry(0, 7, 8)]}
        )
    assert again.status_code == 200


async def test_a_request_asking_to_close_is_answered_and_closed(
    served: RunningCoordinator,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        writer.write(
            commit_request("closing", body_of(entry(0, 0, 1)), extra=b"Connection: close\r\n")
        )
        status, headers, _ = await read_reply(reader)
        assert (status, headers["connection"]) == (200, "close")
        assert await asyncio.wait_for(reader.read(), timeout=10) == b""
    finally:
        writer.close()
