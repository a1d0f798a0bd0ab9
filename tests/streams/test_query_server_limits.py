"""What a caller of the query port can make the process spend, with real sockets: a thread per
connection up to a cap and a 503 past it, headers within a total deadline however slowly they
trickle, and coordinator checks of callers' tokens bounded (docs/streams.md, "Queries over
HTTP")."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from client.http import CoordinatorClient
from client.streams import query_auth, query_server
from client.streams.queries import StoreQueries
from client.streams.query_auth import CallerCheck
from client.streams.query_server import QueryServer
from tests.streams.harness import count_topology
from tests.waiting import until


@pytest_asyncio.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, int]]:
    monkeypatch.setattr(query_server, "READ_TIMEOUT_S", 2.0)
    monkeypatch.setattr(query_server, "MAX_CONNECTIONS", 4, raising=False)
    topology = count_topology("words", "counts").build()
    async with CoordinatorClient("http://127.0.0.1:9") as coordinator:
        queries = StoreQueries(topology, "iq-x", coordinator, {}, lambda: None)
        served = QueryServer("127.0.0.1", 0, None)
        served.start(
            queries,
            coordinator_url="http://127.0.0.1:9",
            group_id="iq-x",
            name=lambda: "a",
            credential=None,
        )
        try:
            assert served._server is not None
            yield "127.0.0.1", served._server.server_port
        finally:
            await served.stop()


def connection_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if "process_request_thread" in t.name}


def trickle(address: tuple[str, int], give_up_s: float) -> float | None:
    """Send a request line a byte a second; how long until the server closed the
    connection (None: still open after ``give_up_s``)."""
    request = b"GET /v1/stores/counts/range HTTP/1.0\r\nHost: x\r\n" + b"X: y\r\n" * 100
    started = time.monotonic()
    with socket.create_connection(address) as caller:
        caller.settimeout(1.0)
        for byte in request:
            if time.monotonic() - started > give_up_s:
                return None
            try:
                caller.sendall(bytes([byte]))
                if caller.recv(1024) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                continue
            except OSError:
                return time.monotonic() - started
    return None


async def test_a_caller_trickling_its_headers_is_cut_at_the_deadline(
    server: tuple[str, int],
) -> None:
    closed_after = await asyncio.to_thread(trickle, server, 8.0)
    assert closed_after is not None, "a byte a second kept the connection open past 8 s"
    assert closed_after < 2.0 + 2.5, closed_after


def idle(address: tuple[str, int]) -> socket.socket:
    caller = socket.create_connection(address)
    caller.settimeout(5.0)
    return caller


async def test_connections_past_the_cap_are_refused_without_a_thread(
    server: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Idle connections stay open for the whole test: the cap, not the deadline, is tested.
    monkeypatch.setattr(query_server, "READ_TIMEOUT_S", 60.0)
    before = connection_threads()
    callers = [await asyncio.to_thread(idle, server) for _ in range(4)]
    await until(lambda: len(connection_threads() - before) == 4, 10, "four connections served")
    extra = [await asyncio.to_thread(idle, server) for _ in range(6)]
    try:
        for caller in extra:
            answer = await asyncio.to_thread(caller.recv, 4096)
            assert answer.startswith(b"HTTP/1.0 503"), answer
            assert b'"error": "BUSY"' in answer
        assert len(connection_threads() - before) == 4
    finally:
        for caller in callers + extra:
            caller.close()
    await until(lambda: not connection_threads() - before, 10, "the connections' threads ended")

    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(f"http://{server[0]}:{server[1]}/v1/stores/counts/range")
    assert reply.json()["error"] != "BUSY", "a closed connection gave its place back"


async def test_checks_of_callers_share_requests_and_a_few_go_out_at_once() -> None:
    asked: list[str | None] = []
    out = 0
    most = 0

    async def answer(request: httpx.Request) -> httpx.Response:
        nonlocal out, most
        asked.append(request.headers.get("authorization"))
        out += 1
        most = max(most, out)
        await asyncio.sleep(0.05)
        out -= 1
        return httpx.Response(401, json={"error": "UNAUTHORIZED", "detail": "no"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        check = CallerCheck(http, "http://coordinator", "iq-x", "words")
        same = await asyncio.gather(*(check.refusal("Bearer same") for _ in range(50)))
        assert {refusal.error for refusal in same if refusal} == {"UNAUTHORIZED"}
        assert len(same) == 50 and asked == ["Bearer same"]
        many = await asyncio.gather(*(check.refusal(f"Bearer made-up-{n}") for n in range(40)))
        assert all(refusal is not None for refusal in many)
    assert len(asked) == 41
    assert most <= query_auth.MAX_CHECKS_IN_FLIGHT
