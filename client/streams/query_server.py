"""Queries over HTTP: a streams instance serves its stores on ``query_port`` (docs/streams.md,
"Queries over HTTP"; the routes in docs/api.md, "Streams instances").

The server is the standard library's, on a thread of its own like the metrics server, so the
client needs no server package; each request is answered by a coroutine on the event loop
(``client.streams.routes``), where the stores, the owner look-ups and the onward requests
live; scans read on ``SCAN_THREADS`` threads of their own.

What a caller can make the process spend is bounded before it is spent: past
``MAX_CONNECTIONS`` open connections a new one is answered 503 and closed by the accepting
thread, without a thread of its own; a connection's request line and headers must all
arrive within ``READ_TIMEOUT_S`` of its opening, however slowly they trickle; and past
``MAX_IN_FLIGHT`` requests waiting for the loop a caller gets 503 at once.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx

from client.streams.queries import StoreQueries
from client.streams.query_auth import CallerCheck
from client.streams.routes import Answer, Request, Routes

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
# Connections open at once, each a thread: the requests in flight, with room for as many
# being read or written; a thread is a stack (8 MiB of address space) in the processing
# process.
MAX_CONNECTIONS = 2 * MAX_IN_FLIGHT
# A request waits this long for its answer, the onward request to the owner included.
ANSWER_TIMEOUT_S = 30.0
# The request line and headers must all arrive within this long of the connection opening
# (a slow caller holds a thread for no longer), and each write of the answer within this
# long of the last.
READ_TIMEOUT_S = 10.0
# Scans at once: each reads stores off the loop, and more would take the processing's CPU.
SCAN_THREADS = 2
_BUSY = json.dumps(
    {"status": 503, "error": "BUSY", "detail": "too many connections to queries"}
).encode()
_REFUSED = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/problem+json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


class QueryServerError(Exception):
    """The query port cannot be listened on."""


class QueryServer:
    """Serves ``routes`` on ``host:port`` (0: any free port) until ``stop``; ``endpoint`` is
    the address advertised to the group: ``advertised`` as given, else this host's name (or
    ``host`` when it is a specific address) and the bound port."""

    def __init__(self, host: str, port: int, advertised: str | None) -> None:
        self._host = host
        self._port = port
        self._advertised = advertised
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._http: httpx.AsyncClient | None = None
        self._scans: ThreadPoolExecutor | None = None

    @property
    def listening(self) -> bool:
        return self._server is not None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() first"
        if self._advertised is not None:
            return self._advertised.rstrip("/")
        host = socket.gethostname() if self._host in ("", "0.0.0.0", "::") else self._host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self._server.server_port}"

    def start(
        self,
        queries: StoreQueries,
        *,
        coordinator_url: str,
        group_id: str,
        name: Callable[[], str | None],
        credential: str | None,
    ) -> None:
        """Listen, on the running loop: ``name`` says who this instance is in the group
        (its instance id, else its member id; None before it joined); ``credential`` is its
        coordinator token, the one its forwards to owners present."""
        loop = asyncio.get_running_loop()
        # One pool for the coordinator's token checks and the onward requests to owners; it
        # holds no credentials: a check sends the caller's, a forward this instance's.
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(ANSWER_TIMEOUT_S / 3), follow_redirects=False
        )
        self._scans = ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="keyrange-scans")
        check = CallerCheck(self._http, coordinator_url, group_id, queries.check_topic)
        routes = Routes(queries, self._http, name, credential=credential, scans=self._scans)
        try:
            self._server = _Server((self._host, self._port), routes, check, loop)
        except OSError as error:
            raise QueryServerError(
                f"cannot serve queries on {self._host}:{self._port}: {error}"
            ) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="keyrange-queries", daemon=True
        )
        self._thread.start()
        logger.info("serving queries", extra={"endpoint": self.endpoint})

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.shutdown)
            server.server_close()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._scans is not None:
            self._scans.shutdown(wait=False, cancel_futures=True)
            self._scans = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        routes: Routes,
        check: CallerCheck,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.routes = routes
        self.check = check
        self.loop = loop
        self.in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accepting thread: a thread for the connection, or, past
        ``MAX_CONNECTIONS``, a 503 sent without waiting and the connection closed."""
        if not self.connections.acquire(blocking=False):
            try:
                request.setblocking(False)
                request.send(_REFUSED)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()

    def answer(self, request: Request) -> Answer:
        """On a request's thread: the loop's answer, or why there is none."""
        if not self.in_flight.acquire(blocking=False):
            return Answer.problem(503, "BUSY", "too many queries in flight", retry_after=1)
        try:
            future = asyncio.run_coroutine_threadsafe(self._answer(request), self.loop)
        except RuntimeError:
            self.in_flight.release()
            return Answer.problem(503, "STOPPING", "the instance is shutting down")
        try:
            return future.result(ANSWER_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            return Answer.problem(504, "TIMEOUT", "no answer in time", retry_after=1)
        finally:
            self.in_flight.release()

    def handle_error(self, request: object, client_address: object) -> None:
        """A caller gone mid-answer is its own business: one line at DEBUG, not the standard
        library's traceback on stderr."""
        logger.debug("query connection failed", exc_info=True)

    async def _answer(self, request: Request) -> Answer:
        refusal = await self.check.refusal(request.authorization)
        if refusal is not None:
            return Answer.problem(refusal.status, refusal.error, refusal.detail)
        return await self.routes.answer(request)


class _Deadline(io.RawIOBase):
    """A connection's reading side that ends at ``deadline`` (``time.monotonic``) however
    the bytes trickle in: each read waits only what is left of it."""

    def __init__(self, connection: socket.socket, deadline: float) -> None:
        super().__init__()
        self._connection = connection
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's headers did not arrive in time")
        self._connection.settimeout(left)
        return self._connection.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = READ_TIMEOUT_S
    server_version = "keyrange-streams"

    def setup(self) -> None:
        super().setup()
        standard, self.rfile = (
            self.rfile,
            io.BufferedReader(_Deadline(self.connection, time.monotonic() + READ_TIMEOUT_S)),
        )
        standard.close()

    def do_GET(self) -> None:
        # The headers are in: from here on the socket's timeout bounds each write.
        self.connection.settimeout(READ_TIMEOUT_S)
        parts = urlsplit(self.path)
        authorizations = self.headers.get_all("Authorization") or []
        if len(authorizations) > 1:
            answer = Answer.problem(401, "UNAUTHORIZED", "more than one Authorization header")
        else:
            answer = self.server.answer(
                Request(
                    path=parts.path,
                    query=parts.query,
                    authorization=authorizations[0] if authorizations else None,
                    forwarded_by=self.headers.get(Routes.FORWARDED_HEADER),
                )
            )
        self._send(answer)

    def _refuse_method(self) -> None:
        self._send(Answer.problem(405, "METHOD_NOT_ALLOWED", "queries are GET requests"))

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_method

    def _send(self, answer: Answer) -> None:
        body = answer.body if answer.raw else json.dumps(answer.body).encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("query %s", format % args)
