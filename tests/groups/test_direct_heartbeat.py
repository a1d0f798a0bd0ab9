"""Stable heartbeats the HTTP protocol answers itself (coordinator/groups/direct.py), over real
sockets to a coordinator served as ``keyrange serve`` serves it, on a real migrated Postgres.

The oracle is the ASGI path on the same server: a chunked body (Transfer-Encoding) always
goes there, so a request is sent both ways and must get the same answer. The coordinator tells
members a 20 s interval, so a held reply that comes well before that was ended by a change."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import uuid
from asyncio.selector_events import _SelectorSocketTransport
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator.app import create_app
from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator, settings_for_tests
from tests.groups.renewal_statements import count_renewal_statements
from tests.groups.test_heartbeat_api import FULL, Member, given_topics, set_range_fetch
from tests.raw_http import Reply, exchange, read_reply, request_bytes
from tests.waiting import until

LONG_INTERVAL = {"heartbeat_interval_ms": 20_000, "session_timeout_default_ms": 60_000}
WAIT_MS = 20_000
# Far below the 20 s interval, far above what a change takes to arrive on a busy machine.
PROMPTLY_S = 10.0


async def listening(database: str) -> RunningCoordinator:
    """A coordinator on ``database``, once it hears membership changes (until then no
    heartbeat is held)."""
    coordinator = RunningCoordinator(create_app(settings_for_tests(**LONG_INTERVAL), database))
    await coordinator.start()
    await until(lambda: coordinator.app.state.membership_watch.listening, 10, "the watch to listen")
    return coordinator


@pytest_asyncio.fixture(scope="module")
async def served(make_migrated_database: MakeDatabase) -> AsyncIterator[RunningCoordinator]:
    coordinator = await listening(await make_migrated_database())
    yield coordinator
    await coordinator.stop()


@pytest_asyncio.fixture
async def api(served: RunningCoordinator) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
        yield client


def group() -> str:
    return f"direct-{uuid.uuid4().hex[:8]}"


def heartbeat_request(group_id: str, body: bytes, **options: Any) -> bytes:
    return request_bytes(f"/v1/groups/{group_id}/heartbeat", body, **options)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def waiting() -> float:
    return sample("keyrange_heartbeats_waiting")


async def stable_member(
    served: RunningCoordinator, api: httpx.AsyncClient, group_id: str, topic: str
) -> Member:
    await given_topics(served.app, **{topic: 1})
    await set_range_fetch(api, topic, True)
    member = Member(api, group_id)
    await member.join([topic])
    await member.heartbeat()  # reports what it was given: stable
    assert member.owned == [{"topic": topic, "partition": 0, "ranges": [FULL]}]
    return member


def beat_of(member: Member, **extra: Any) -> bytes:
    body = {"member_id": member.member_id, "member_epoch": member.epoch, "owned": member.owned}
    return json.dumps({**body, **extra}).encode()


async def both_ways(served: RunningCoordinator, group_id: str, body: bytes, **options: Any) -> Any:
    """The request's reply by the protocol's path, then by the ASGI path."""
    (direct,) = await exchange(served.port, heartbeat_request(group_id, body, **options))
    (asgi,) = await exchange(
        served.port, heartbeat_request(group_id, body, chunked=True, **options)
    )
    return direct, asgi


def alike(direct: Reply, asgi: Reply) -> None:
    assert (direct[0], direct[2]) == (asgi[0], asgi[2])
    assert direct[1]["content-type"] == asgi[1]["content-type"]
    assert "date" in direct[1] and "server" in direct[1]


async def test_a_stable_heartbeat_is_answered_without_the_asgi_application(
    served: RunningCoordinator, api: httpx.AsyncClient, asgi_calls: list[str]
) -> None:
    member = await stable_member(served, api, group(), "plain_flow")
    served_before = sample(
        "keyrange_http_requests_total",
        method="POST",
        route="/v1/groups/{group_id}/heartbeat",
        status="200",
    )
    asgi_calls.clear()

    direct, asgi = await both_ways(served, member.group, beat_of(member))

    alike(direct, asgi)
    assert direct[0] == 200
    assert json.loads(direct[2])["heartbeat_now"] is False
    assert asgi_calls == [f"/v1/groups/{member.group}/heartbeat"]  # the chunked twin only
    counted = sample(
        "keyrange_http_requests_total",
        method="POST",
        route="/v1/groups/{group_id}/heartbeat",
        status="200",
    )
    assert counted == served_before + 2


CASES: list[tuple[str, bytes, dict[str, Any]]] = [
    ("malformed JSON", b'{"member_epoch": ', {}),
    ("text, not JSON", b'{"member_epoch": 0}', {"content_type": b"text/plain"}),
    ("an empty body", b"", {}),
    ("not an object", b"[]", {}),
    ("an epoch as text", b'{"member_epoch": "1", "member_id": "m-1"}', {}),
    ("an epoch without its member", b'{"member_epoch": 1}', {}),
    ("an unknown field", b'{"member_epoch": 2, "member_id": "m-1", "colour": "red"}', {}),
    ("a member the group does not know", b'{"member_epoch": 3, "member_id": "m-nobody"}', {}),
    ("a leave of nobody", b'{"member_epoch": -1, "member_id": "m-nobody"}', {}),
]


@pytest.mark.parametrize(("case", "body", "options"), CASES, ids=[case[0] for case in CASES])
async def test_each_request_it_cannot_serve_gets_the_asgi_path_s_answer(
    served: RunningCoordinator, case: str, body: bytes, options: dict[str, Any]
) -> None:
    direct, asgi = await both_ways(served, "refusals", body, **options)
    alike(direct, asgi)


async def test_a_held_heartbeat_is_answered_at_once_by_a_change(
    served: RunningCoordinator, api: httpx.AsyncClient, asgi_calls: list[str]
) -> None:
    group_id = group()
    holder = await stable_member(served, api, group_id, "shared_flow")
    changed_before = sample("keyrange_heartbeats_held_total", outcome="changed")
    asgi_calls.clear()
    before = waiting()
    held = asyncio.create_task(holder.heartbeat(wait_ms=WAIT_MS))
    await until(lambda: waiting() > before or held.done(), 10, "the heartbeat to be held")
    assert not held.done(), f"answered at once: {held.result()}"
    assert asgi_calls == []

    started = time.monotonic()
    await Member(api, group_id).join(["shared_flow"])
    reply = await asyncio.wait_for(held, WAIT_MS / 1000 + 10)

    assert time.monotonic() - started < PROMPTLY_S
    assert reply["heartbeat_now"] is True
    assert sample("keyrange_heartbeats_held_total", outcome="changed") == changed_before + 1
    # The holder's next heartbeat is no longer stable: the ASGI path serves it, at once.
    asgi_calls.clear()
    revoked = await holder.heartbeat(wait_ms=WAIT_MS)
    assert asgi_calls == [f"/v1/groups/{group_id}/heartbeat"]
    assert revoked["heartbeat_now"] is False
    assert revoked["assignment"][0]["ranges"][0] != FULL


async def test_a_held_heartbeat_nothing_changes_for_is_answered_when_its_wait_runs_out(
    served: RunningCoordinator, api: httpx.AsyncClient
) -> None:
    member = await stable_member(served, api, group(), "quiet_flow")
    waited_before = sample("keyrange_heartbeats_held_total", outcome="waited")
    wait_ms = 1_500
    started = time.monotonic()
    reply = await member.heartbeat(wait_ms=wait_ms)
    took = time.monotonic() - started

    assert reply["heartbeat_now"] is True
    assert took >= wait_ms / 1000 - 0.05
    assert sample("keyrange_heartbeats_held_total", outcome="waited") == waited_before + 1


async def test_a_client_that_leaves_while_held_costs_nothing_once_its_wait_ends(
    served: RunningCoordinator, api: httpx.AsyncClient
) -> None:
    member = await stable_member(served, api, group(), "gone_flow")
    before = waiting()
    _, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(heartbeat_request(member.group, beat_of(member, wait_ms=1_000)))
    await writer.drain()
    await until(lambda: waiting() > before, 10, "the heartbeat to be held")
    writer.close()

    await until(lambda: waiting() == before, 10, "the held heartbeat's wait to end")
    again = await member.heartbeat()
    assert again["heartbeat_now"] is False


@dataclass
class Alone:
    """A coordinator of one test's own, on its own database, with a stable member."""

    coordinator: RunningCoordinator
    database: str
    member: Member


@pytest_asyncio.fixture
async def alone(make_migrated_database: MakeDatabase) -> AsyncIterator[Alone]:
    database = await make_migrated_database()
    coordinator = await listening(database)
    try:
        async with httpx.AsyncClient(base_url=coordinator.url, timeout=60) as api:
            member = await stable_member(coordinator, api, group(), "own_flow")
        yield Alone(coordinator, database, member)
    finally:
        await coordinator.stop()


async def test_a_shutdown_answers_a_held_heartbeat_and_closes_its_connection(
    alone: Alone,
) -> None:
    before = waiting()
    reader, writer = await asyncio.open_connection("127.0.0.1", alone.coordinator.port)
    try:
        writer.write(heartbeat_request(alone.member.group, beat_of(alone.member, wait_ms=1_500)))
        await writer.drain()
        await until(lambda: waiting() > before, 10, "the heartbeat to be held")
        alone.coordinator.server.should_exit = True
        status, headers, body = await asyncio.wait_for(read_reply(reader), 30)
        assert (status, headers["connection"]) == (200, "close")
        assert json.loads(body)["heartbeat_now"] is True
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()


async def test_a_renewal_that_fails_is_answered_as_the_asgi_path_answers_it(
    alone: Alone,
) -> None:
    """The members' table taken away under a running coordinator: the renewal's statement
    fails in the database, and both paths answer with the same problem document."""
    engine = create_async_engine(alone.database)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("ALTER TABLE members RENAME TO members_away"))
    finally:
        await engine.dispose()

    direct, asgi = await both_ways(alone.coordinator, alone.member.group, beat_of(alone.member))

    alike(direct, asgi)
    assert direct[0] == 500
    assert json.loads(direct[2])["error"] == "INTERNAL_ERROR"


async def test_a_heartbeat_its_renewal_finds_not_stable_is_renewed_once(alone: Alone) -> None:
    """Handed to the ASGI path, it goes to the locked path without a second renewal's turn:
    a join's hand-off waits for the member's next heartbeat, so that turn was the join's."""
    engine = alone.coordinator.app.state.engine
    renewals = count_renewal_statements(engine)
    # Every connection from here on is a new one, which reports its statements.
    await engine.dispose()
    member = alone.member
    async with httpx.AsyncClient(base_url=alone.coordinator.url, timeout=60) as api:
        member.api = api
        await Member(api, member.group).join(["own_flow"])
        revoked = await member.heartbeat(wait_ms=WAIT_MS)

    assert renewals() == 1
    assert revoked["heartbeat_now"] is False
    assert revoked["assignment"][0]["ranges"][0] != FULL


def garbage_but_asyncio_sockets() -> list[object]:
    """``gc.garbage`` without what only asyncio's socket transports reach: the test's event
    loop is asyncio's, whose transport keeps a bound method of its own, a cycle on either end
    of every closed connection (the coordinator serves on uvloop's). A closed transport no
    longer reaches its protocol, so the coordinator's objects stay in."""
    in_garbage = {id(thing): thing for thing in gc.garbage}
    asyncio_own: set[int] = set()
    reached = [thing for thing in gc.garbage if isinstance(thing, _SelectorSocketTransport)]
    while reached:
        thing = reached.pop()
        if id(thing) not in asyncio_own:
            asyncio_own.add(id(thing))
            reached += (r for r in gc.get_referents(thing) if id(r) in in_garbage)
    return [thing for key, thing in in_garbage.items() if key not in asyncio_own]


async def test_heartbeats_on_the_protocol_s_path_leave_no_cycles_for_the_collector(
    served: RunningCoordinator, api: httpx.AsyncClient
) -> None:
    """Neither a held reply nor a closed connection leaves work for the garbage collector,
    whose collections stop the event loop (bench/history/2026-11-27-issue-29-part-3-round-9.md)."""
    member = await stable_member(served, api, group(), "collected_flow")
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:

        async def beat(**extra: Any) -> None:
            writer.write(heartbeat_request(member.group, beat_of(member, **extra)))
            status, _, _ = await read_reply(reader)
            assert status == 200

        await beat()
        await beat(wait_ms=50)
        connections = served.server.server_state.connections
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                await beat()
                await beat(wait_ms=50)
            # A connection closed by its client, as members that move to another replica do.
            gone_reader, gone_writer = await asyncio.open_connection("127.0.0.1", served.port)
            gone_writer.write(heartbeat_request(member.group, beat_of(member)))
            assert (await read_reply(gone_reader))[0] == 200
            open_before = len(connections)
            gone_writer.close()
            await until(lambda: len(connections) < open_before, 10, "the server to see it gone")
            gc.collect()
            left = Counter(
                f"{type(thing).__module__}.{type(thing).__qualname__}"
                for thing in garbage_but_asyncio_sockets()
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    finally:
        writer.close()
    assert left == Counter()
