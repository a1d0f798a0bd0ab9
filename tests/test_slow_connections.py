"""Slow and malformed connections: connections that send their headers or body a byte at a
time, or nothing at all, are closed at the configured deadlines while other requests are
served; the connection limit and keep-alive timeout reach the server; an over-limit body in
chunks is 413 on every route."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from coordinator.app import create_app
from coordinator.serving import server_config
from tests.fixtures.coordinator import RunningCoordinator, settings_for_tests

StartCoordinator = Callable[..., Awaitable[RunningCoordinator]]

READ_TIMEOUT_S = 1.0
# How long past its deadline a slow connection may stay open on a busy two-core machine.
GRACE_S = 5.0
SLOW_CONNECTIONS = 5
COMMIT = {"partitions": [{"topic": "t", "partition": 0, "offset": 1}]}


async def open_slowly(url: str, first: bytes, drip: bytes) -> float:
    """Send ``first``, then ``drip`` a byte every 100 ms (over and over) until the server
    closes the connection; the seconds it stayed open. AssertionError when the server left
    it open past the deadline and the grace."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    deadline = started + READ_TIMEOUT_S + GRACE_S
    reader, writer = await asyncio.open_connection(host, int(port))
    closed = asyncio.ensure_future(reader.read())
    try:
        writer.write(first)
        position = 0
        while not closed.done() and time.monotonic() < deadline:
            if drip:
                with contextlib.suppress(ConnectionError):
                    writer.write(drip[position % len(drip) : position % len(drip) + 1])
                    await writer.drain()
                position += 1
            await asyncio.wait([closed], timeout=0.1)
        assert closed.done(), f"still open after {time.monotonic() - started:.1f} s"
        return time.monotonic() - started
    finally:
        closed.cancel()
        writer.close()


class Traffic:
    """Ordinary requests, one after another, while slow connections are open."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.served: list[int] = []

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as http:
            while True:
                self.served.append((await http.get("/livez")).status_code)
                reply = await http.post("/v1/groups/slow-traffic/offsets/commit", json=COMMIT)
                self.served.append(reply.status_code)
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def traffic_to(url: str) -> AsyncIterator[Traffic]:
    traffic = Traffic(url)
    running = asyncio.create_task(traffic.run())
    try:
        yield traffic
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


@pytest.fixture
async def served_url(start_coordinator: StartCoordinator, database_url: str) -> str:
    coordinator = await start_coordinator(
        database_url, header_read_timeout_s=READ_TIMEOUT_S, body_read_timeout_s=READ_TIMEOUT_S
    )
    return coordinator.url


HEADERS_START = b"POST /v1/groups/slow/offsets/commit HTTP/1.1\r\nHost: c\r\n"
WHOLE_HEADERS = HEADERS_START + b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"


@pytest.mark.parametrize(
    ("first", "drip"),
    [
        pytest.param(HEADERS_START, b"X-Slow: abcdefghijklmnopqrstuvwxyz", id="headers"),
        pytest.param(WHOLE_HEADERS, b'{"partitions": [' + b" " * 100, id="body"),
        pytest.param(b"", b"", id="nothing"),
    ],
)
async def test_slow_connections_are_closed_at_the_deadline_while_others_are_served(
    served_url: str, first: bytes, drip: bytes
) -> None:
    async with traffic_to(served_url) as traffic:
        open_for = await asyncio.gather(
            *(open_slowly(served_url, first, drip) for _ in range(SLOW_CONNECTIONS))
        )
        served_meanwhile = list(traffic.served)
    assert all(READ_TIMEOUT_S * 0.9 <= seconds < READ_TIMEOUT_S + GRACE_S for seconds in open_for)
    assert served_meanwhile and set(served_meanwhile) == {200}, served_meanwhile


async def test_a_kept_alive_connection_gets_a_new_header_deadline_per_request(
    served_url: str,
) -> None:
    request = b"GET /livez HTTP/1.1\r\nHost: c\r\n\r\n"
    host, port = served_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for _ in range(3):
            writer.write(request)
            assert (await asyncio.wait_for(reader.readline(), timeout=5)).startswith(
                b"HTTP/1.1 200"
            )
            await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), timeout=5)
    finally:
        writer.close()


async def test_a_header_deadline_shorter_than_the_body_deadline_before_it_is_kept(
    start_coordinator: StartCoordinator, database_url: str
) -> None:
    """A request's body waits under the long deadline, then the next request's headers stall:
    they are cut at the short deadline, not when the long one would have passed."""
    coordinator = await start_coordinator(
        database_url, header_read_timeout_s=READ_TIMEOUT_S, body_read_timeout_s=60
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", coordinator.port)
    try:
        writer.write(HEADERS_START + b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n")
        # Past the header deadline, with the body not sent yet: the body's deadline holds.
        await asyncio.sleep(READ_TIMEOUT_S * 1.5)
        writer.write(b"{}")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        assert head.startswith(b"HTTP/1.1 400")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        stalled = time.monotonic()
        writer.write(HEADERS_START)
        assert await asyncio.wait_for(reader.read(), timeout=READ_TIMEOUT_S + GRACE_S) == b""
        assert time.monotonic() - stalled >= READ_TIMEOUT_S * 0.9
    finally:
        writer.close()


async def test_a_kept_alive_connection_is_closed_when_idle_past_the_keep_alive_timeout(
    start_coordinator: StartCoordinator, database_url: str
) -> None:
    """Between requests the keep-alive timeout runs; once a request has begun, its own
    deadlines do: a request whose headers take longer than the keep-alive timeout is
    answered, and the connection idle after it is closed at the timeout."""
    keep_alive_s = 1
    coordinator = await start_coordinator(
        database_url, keep_alive_timeout_s=keep_alive_s, header_read_timeout_s=60
    )
    request = b"GET /livez HTTP/1.1\r\nHost: c\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", coordinator.port)
    try:
        writer.write(request)
        await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), timeout=5)
        writer.write(request[:10])
        await asyncio.sleep(keep_alive_s * 1.5)
        writer.write(request[10:])
        await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), timeout=5)
        idle = time.monotonic()
        assert await asyncio.wait_for(reader.read(), timeout=keep_alive_s + GRACE_S) == b""
        assert time.monotonic() - idle >= keep_alive_s * 0.9
    finally:
        writer.close()


def test_the_connection_settings_reach_the_server() -> None:
    settings = settings_for_tests(
        keep_alive_timeout_s=42,
        max_connections=7,
        header_read_timeout_s=3.5,
        body_read_timeout_s=8.0,
    )
    config = server_config(create_app(settings, "postgresql+asyncpg://unused/unused"), settings)
    config.load()
    assert config.timeout_keep_alive == 42
    # The protocol limits connections; uvicorn's limit would count request tasks too.
    assert config.limit_concurrency is None
    protocol = config.http_protocol_class
    assert getattr(protocol, "header_timeout_s", None) == 3.5
    assert getattr(protocol, "body_timeout_s", None) == 8.0
    assert getattr(protocol, "max_connections", None) == 7


async def test_requests_beyond_the_connection_limit_are_503(
    start_coordinator: StartCoordinator, database_url: str
) -> None:
    coordinator = await start_coordinator(database_url, max_connections=3)
    host, port = coordinator.url.removeprefix("http://").split(":")
    idle = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
    try:
        async with httpx.AsyncClient(base_url=coordinator.url) as http:
            refused = await http.get("/livez")
        assert refused.status_code == 503
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.headers["connection"] == "close"
        assert refused.json()["error"] == "SERVICE_UNAVAILABLE"
        assert "KEYRANGE_MAX_CONNECTIONS" in refused.json()["detail"]
        for _, writer in idle:
            writer.close()
        async with httpx.AsyncClient(base_url=coordinator.url) as http:
            for _ in range(100):
                if (await http.get("/livez")).status_code == 200:
                    return
                await asyncio.sleep(0.05)
        raise AssertionError("the coordinator never served again once connections closed")
    finally:
        for _, writer in idle:
            writer.close()


LIMIT = 1024


@pytest.fixture(scope="module")
def routes() -> list[tuple[str, str]]:
    app = create_app(settings_for_tests(), "postgresql+asyncpg://unused/unused")
    parameters = {"{group_id}": "g", "{topic}": "t", "{member_id}": "m"}
    found: list[tuple[str, str]] = []
    for template, operations in app.openapi()["paths"].items():
        path = template
        for name, value in parameters.items():
            path = path.replace(name, value)
        found.extend((method.upper(), path) for method in operations)
    return found


async def chunks(total: int) -> AsyncIterator[bytes]:
    """A body without a Content-Length: httpx sends it chunked."""
    for _ in range(total // 256):
        yield b" " * 256


async def test_an_over_limit_chunked_body_is_413_on_every_route(
    make_migrated_database: Callable[[], Awaitable[str]], routes: list[tuple[str, str]]
) -> None:
    app = create_app(settings_for_tests(max_body_bytes=LIMIT), await make_migrated_database())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            for method, path in routes:
                reply = await http.request(
                    method,
                    path,
                    content=chunks(4 * LIMIT),
                    headers={"content-type": "application/json"},
                )
                assert reply.status_code == 413, (method, path, reply.text)
                assert reply.json()["error"] == "INVALID_REQUEST"
