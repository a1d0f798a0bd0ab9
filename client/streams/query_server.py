"""Queries over HTTP: a streams instance serves its stores on ``query_port`` (docs/streams.md,
"Queries over HTTP"; the routes in docs/api.md, "Streams instances").

The server is the standard library's, on a thread of its own like the metrics server, so the
client needs no server package; each request is answered by a coroutine on the event loop
(``client.streams.routes``), where the stores, the owner look-ups and the onward requests
live. Requests in flight are bounded: past ``MAX_IN_FLIGHT`` a caller gets 503 at once
instead of a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import httpx

from client.streams.queries import StoreQueries
from client.streams.query_auth import CallerCheck
from client.streams.routes import Answer, Request, Routes

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
# A request waits this long for its answer, the onward request to the owner included.
ANSWER_TIMEOUT_S = 30.0
# Headers must arrive within this long of the connection opening (a slow caller holds a
# thread for no longer).
READ_TIMEOUT_S = 10.0


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
    ) -> None:
        """Listen, on the running loop: ``name`` says who this instance is in the group
        (its instance id, else its member id; None before it joined)."""
        loop = asyncio.get_running_loop()
        # One pool for the coordinator's token checks and the onward requests to owners; it
        # sends no credentials of its own, only the caller's.
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(ANSWER_TIMEOUT_S / 3), follow_redirects=False
        )
        check = CallerCheck(self._http, coordinator_url, group_id, queries.check_topic)
        routes = Routes(queries, self._http, name)
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


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = READ_TIMEOUT_S
    server_version = "keyrange-streams"

    def do_GET(self) -> None:
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
