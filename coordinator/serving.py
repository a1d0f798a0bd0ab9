"""The HTTP server's side of slow and malformed connections: how the coordinator is served
by uvicorn (``keyrange serve`` builds its server here), with read deadlines uvicorn lacks and
a connection limit of its own.

Uvicorn closes a keep-alive connection that stays idle between requests, and can refuse
requests beyond a number of open connections, but it waits forever for a request's headers
and body: a connection that sends nothing, or a header line a byte at a time, holds its
socket and its slot until the peer goes away. A handful of such connections per team would
exhaust the connection limit for everyone. The protocol below gives each request's headers,
and then its body, a deadline, and closes the connection when it passes.

The limit on open connections is the protocol's too, not uvicorn's ``limit_concurrency``:
uvicorn also counts request tasks against it, and a request task does not end with its
connection (a held heartbeat waits out its wait), so with 10,000 waiting members a limit of
12,000 refused about 10,000 requests in one ``bench-scale`` run with a plain-text 503 while
fewer than 10,000 connections were open. A connection counts once, whatever its requests
do; one past the limit has its first request answered with a 503 problem document and is
closed.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from coordinator import metrics
from coordinator.app import CoordinatorApp
from coordinator.direct_routes import DirectCycle, DirectRoutes
from coordinator.errors import ServiceUnavailable
from coordinator.groups.direct import DirectHeartbeat
from coordinator.offsets.direct import DirectCommit
from coordinator.problems import error_response
from coordinator.settings import Settings

log = logging.getLogger(__name__)


# What a kept-alive connection waits for between requests (uvicorn's keep-alive timeout).
_IDLE = "next request"


class ReadDeadlines(HttpToolsProtocol):
    """Uvicorn's httptools protocol with a deadline for a request's headers (counted from
    the connection's opening, or from the first byte of a later request on it), one for
    its body (counted from the end of the headers), and at most ``max_connections`` open
    connections (``None``: no limit)."""

    header_timeout_s = 10.0
    body_timeout_s = 30.0
    max_connections: int | None = None
    # Requests this protocol answers itself (``coordinator.direct_routes``); None: all go
    # through the ASGI application.
    direct_routes: DirectRoutes | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The request's read deadline (loop time), its timeout and what it waits for; None
        # while no request is being read.
        self._deadline: tuple[float, float, str] | None = None
        # One timer per connection, moved only when a deadline falls before it and otherwise
        # left to find a later deadline when it fires: a timer set and cancelled twice per
        # request cost a few per cent of a commit's CPU.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._direct = self.direct_routes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # ``connections`` is uvicorn's set of this server's open connections, this one in it.
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            self.app = _TooManyConnections(self.max_connections, len(self.connections))
            self._direct = None
        self._arm(self.header_timeout_s, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # A new connection's deadline runs from its opening; a request that follows another
        # on a kept-alive connection gets its own from its first byte.
        if self._deadline is None or self._deadline[2] == _IDLE:
            self._arm(self.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        direct = None if self._direct is None else self._direct.begin(self, self._start_asgi_task)
        if direct is None:
            super().on_headers_complete()
        else:
            self.cycle = direct
        # A request without a body completes at once, and on_message_complete disarms this.
        self._arm(self.body_timeout_s, "body")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        if isinstance(self.cycle, DirectCycle):
            self.cycle.decide()

    def on_response_complete(self) -> None:
        """uvicorn's, with the keep-alive timeout on the connection's one timer: uvicorn sets
        a timer of its own after every response and cancels it at the next request's first
        byte, which cost as much as the read deadlines' two did."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._arm(self.timeout_keep_alive, _IDLE)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)
        # A request's cycle calls back into its protocol: a closed connection's protocol, its
        # cycles and transport formed a cycle only the garbage collector freed, 15 objects a
        # connection (at 10,000 members, collections of 0.7 s after a wave of reconnections).
        # Nothing reaches a closed connection's cycle through the protocol again.
        self.cycle = None  # type: ignore[assignment]
        self.pipeline.clear()

    def _arm(self, timeout_s: float, part: str) -> None:
        at = self.loop.time() + timeout_s
        self._deadline = (at, timeout_s, part)
        if self._timer is None or at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._set_timer(at)

    def _disarm(self) -> None:
        self._deadline = None

    def _set_timer(self, at: float) -> None:
        self._timer = self.loop.call_at(at, self._deadline_check)
        self._timer_at = at

    def _deadline_check(self) -> None:
        self._timer = None
        if self._deadline is None:
            return
        at, timeout_s, part = self._deadline
        if at > self.loop.time():
            self._set_timer(at)
            return
        self._deadline = None
        if part == _IDLE:
            self.timeout_keep_alive_handler()
        else:
            self._too_slow(part, timeout_s)

    def _too_slow(self, part: str, timeout_s: float) -> None:
        if self.transport.is_closing():
            return
        if self.flow.read_paused:
            # The server stopped reading (a pipelined request waits for the one before it,
            # or the application has not taken the body buffered so far): that is not the
            # client's slowness, so the connection gets another full timeout.
            self._arm(timeout_s, part)
            return
        log.warning(
            "closing a connection too slow to send its request",
            extra={"part": part, "timeout_s": timeout_s, "client": _peer_host(self.client)},
        )
        self.transport.close()


def _peer_host(client: tuple[str, int] | None) -> str | None:
    return None if client is None else client[0]


class _TooManyConnections:
    """The application of a connection opened past the limit: its request gets a 503 problem
    document (``service_unavailable``, retriable, as every client of ours retries it) and
    the connection is closed, so it stops counting at once."""

    def __init__(self, limit: int, open_connections: int) -> None:
        self.limit = limit
        self.open_connections = open_connections

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        log.warning(
            "refused a request: too many open connections",
            extra={"open_connections": self.open_connections, "max_connections": self.limit},
        )
        response = error_response(
            ServiceUnavailable(
                f"this coordinator serves at most {self.limit} open connections "
                "(KEYRANGE_MAX_CONNECTIONS); retry shortly"
            )
        )
        response.headers["connection"] = "close"
        await response(scope, receive, send)
        metrics.HTTP_REQUESTS.labels(scope["method"], "unmatched", "503").inc()


def read_deadlines(
    settings: Settings, direct_routes: DirectRoutes | None = None
) -> type[ReadDeadlines]:
    """The protocol class with the settings' deadlines and connection limit (uvicorn builds
    one per connection), answering ``direct_routes`` itself when given."""
    return type(
        "ConfiguredReadDeadlines",
        (ReadDeadlines,),
        {
            "header_timeout_s": settings.header_read_timeout_s,
            "body_timeout_s": settings.body_read_timeout_s,
            "max_connections": settings.max_connections,
            "direct_routes": direct_routes,
        },
    )


# Files a coordinator holds besides its clients' connections: the database pool's and the
# membership watch's connections, the Kafka client's, the embedded services' pipes, logs and
# the libraries' files, with room to spare.
OTHER_OPEN_FILES = 256


def open_files_needed(settings: Settings) -> int:
    """Descriptors the connection limit may use: one per client connection (a waiting
    member holds one), plus the database pool and everything else the process opens."""
    return (
        settings.max_connections
        + settings.db_pool_size
        + settings.db_max_overflow
        + OTHER_OPEN_FILES
    )


def raise_open_file_limit(settings: Settings) -> None:
    """Raise the process's soft open-file limit to what the connection limit needs, within
    the hard limit. Many hosts start processes at 1,024 open files: without this, the
    1,025th waiting member would fail ``accept`` and never be answered, well before
    ``KEYRANGE_MAX_CONNECTIONS`` turned anyone away with a 503."""
    needed = open_files_needed(settings)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    limit = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if limit > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        log.info(
            "raised the open-file limit",
            extra={"previous": soft, "limit": limit, "needed": needed},
        )
    if limit < needed:
        log.warning(
            "the open-file limit is below what the connection limit needs: raise the hard "
            "limit (ulimit -Hn, LimitNOFILE=) or lower KEYRANGE_MAX_CONNECTIONS",
            extra={"limit": limit, "needed": needed, "max_connections": settings.max_connections},
        )


def server_config(app: Any, settings: Settings) -> uvicorn.Config:
    """How the coordinator is served: its listen address, the timeouts from the settings, the
    connection limit in the protocol (:class:`ReadDeadlines`, not uvicorn's
    ``limit_concurrency``), and no access log (requests are counted in metrics).

    The listen backlog is the connection limit (the kernel caps it at
    ``net.core.somaxconn``): when a replica restarts, every member it served reconnects at
    once, and connections beyond uvicorn's default of 2,048 would wait for SYN retries, a
    second and more each."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=read_deadlines(settings, _direct_routes(app)),
        timeout_keep_alive=settings.keep_alive_timeout_s,
        backlog=settings.max_connections,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=30,
    )


def _direct_routes(app: Any) -> DirectRoutes | None:
    """The coordinator's commits and stable heartbeats answered by the protocol; none for
    another application, nor while those routes are traced (the tracer is chosen once, when
    the app is made)."""
    if isinstance(app, CoordinatorApp) and app.state.route_tracer is None:
        return DirectRoutes(app, [DirectCommit, DirectHeartbeat])
    return None
