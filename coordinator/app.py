"""The coordinator's FastAPI application: routers, the error handlers, route metrics, the
middlewares (request-size limit, commit fast path), and the lifespan that owns the database engine
and background loops."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from client.tracing import tracing_enabled
from coordinator import metrics
from coordinator.auth import admit
from coordinator.body_limit import BodySizeLimit
from coordinator.cross_origin import refuse_cross_origin
from coordinator.db.engine import make_engine
from coordinator.direct_routes import group_route
from coordinator.errors import KeyrangeError
from coordinator.gc_pauses import time_collections
from coordinator.groups import fast_path as heartbeat_fast_path
from coordinator.groups.repository import request_rebalances
from coordinator.groups.stored_topics import StoredTopics
from coordinator.groups.turns import GroupTurns
from coordinator.groups.watch import MembershipWatch
from coordinator.kafka import ClusterMetadata, KafkaClusterError
from coordinator.offsets import fast_path
from coordinator.offsets.batching import CommitBatcher
from coordinator.offsets.commit_tracing import route_tracer
from coordinator.problems import database_gone, declare_problems, error_response
from coordinator.route_tracing import traced_route
from coordinator.settings import Settings

log = logging.getLogger(__name__)

BackgroundLoop = Callable[[FastAPI], Awaitable[None]]


class RouteMetrics:
    """Count and time requests by route template, so ids in paths don't explode label sets."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            method = scope.get("method", "GET")
            metrics.HTTP_REQUESTS.labels(method, template, str(status)).inc()
            metrics.HTTP_LATENCY.labels(method, template).observe(time.perf_counter() - started)


# Young-generation collections every 200,000 net container allocations instead of 700, and
# older generations proportionally rarer.
SERVING_GC_THRESHOLDS = (200_000, 50, 100)


def tune_gc_for_serving() -> None:
    """Move everything built so far out of the garbage collector's sight, and collect rarely.

    Modules, routes, models and pools live as long as the process; left in view, every full
    collection scans them again, which took tens of milliseconds per pause under load. A
    commit allocates hundreds of short-lived containers, so at the default threshold the
    collector ran every few commits; rarer collections cost a few megabytes of garbage held a
    little longer and made the storage layer about a fifth faster.

    Waiting members set the threshold's size: a young collection walks every container
    allocated since the last one that is still alive, and with every held heartbeat renewed
    within its interval that is nearly all of them, about 18 each. At 10,000 members a young
    collection stopped the event loop for 0.1-0.4 s, and at 20,000 net allocations they came
    every few seconds; at 200,000, none came in a minute of that load. Serving makes no
    reference cycles of its own (tests/groups/test_heartbeat_garbage.py and
    tests/groups/test_direct_heartbeat.py), so the rarer collections hold little garbage.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLDS)
    time_collections()


def _install_error_handlers(app: FastAPI) -> None:
    """``OSError`` is named on its own: connecting to a stopped database raises it unwrapped
    by SQLAlchemy, and only ``Exception``'s handler would catch it, which Starlette answers
    and then re-raises as an unhandled error, one traceback per request of the outage."""

    async def render(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    for handled in (
        KeyrangeError,
        RequestValidationError,
        StarletteHTTPException,
        OperationalError,
        InterfaceError,
        PoolTimeout,
        DBAPIError,
        OSError,
        Exception,
    ):
        app.add_exception_handler(handled, render)


async def _seed_switches(app: FastAPI) -> None:
    settings: Settings = app.state.settings
    async with app.state.engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO coordinator_config (id, accept_individual_commit, "
                "default_accept_range_fetch) VALUES (1, :accept, :range_fetch) "
                "ON CONFLICT (id) DO NOTHING"
            ),
            {
                "accept": settings.accept_individual_commit,
                "range_fetch": settings.default_accept_range_fetch,
            },
        )


async def _connect_cluster(settings: Settings) -> ClusterMetadata | None:
    """Kafka is needed for partition counts and lag, not to serve commits: a coordinator
    that starts while Kafka is down serves anyway and the reader reconnects on use."""
    if settings.kafka_bootstrap is None:
        return None
    cluster = ClusterMetadata(settings.kafka_bootstrap, security=settings.kafka_security)
    try:
        await cluster.start()
    except KafkaClusterError as exc:
        log.warning("Kafka not reachable at start; will retry", extra={"error": str(exc)})
    return cluster


def _rebalance_on_max_ic(app: FastAPI) -> Callable[[str], Awaitable[None]]:
    async def flag(group_id: str) -> None:
        try:
            async with app.state.engine.begin() as connection:
                await request_rebalances(
                    connection, [group_id], "max individual-commit ranges reached"
                )
        except (OperationalError, InterfaceError, DBAPIError) as exc:
            # The next commit that hits the cap flags it again.
            log.warning(
                "could not request a rebalance",
                extra={"group_id": group_id, "error": type(exc).__name__},
            )

    return flag


async def _run_forever(name: str, loop: BackgroundLoop, app: FastAPI) -> None:
    """Keep a background loop alive across failures; it must never take the service down."""
    while True:
        try:
            await loop(app)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if database_gone(exc):
                # An outage operators expect (a restart, a failover): no traceback to read.
                log.warning(
                    "background loop lost the database; restarting",
                    extra={"loop": name, "error": type(exc).__name__},
                )
            else:
                log.exception("background loop failed; restarting", extra={"loop": name})
            await asyncio.sleep(1.0)


class CoordinatorApp(FastAPI):
    """FastAPI with cross-origin state changes refused and the token checked ahead of
    everything (``coordinator.cross_origin``, ``coordinator.auth.admit``), and commits served
    ahead of FastAPI, by ``coordinator/offsets/fast_path.py``.

    Commit requests skip FastAPI's entry point, Starlette's error middleware and the
    middlewares below (the fast path applies the body limit and records the route metrics
    itself): on the hottest request, that work cost a fifth of the handler's CPU.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                refuse_cross_origin(scope)
                admit(self.state.settings, scope)
            except KeyrangeError as exc:
                await _refuse(exc, scope, receive, send)
                return
        group_id = group_route(scope, fast_path.SUFFIX)
        if group_id is not None:
            scope["app"] = self
            await fast_path.serve_fast_path(scope, receive, send, group_id)
            return
        group_id = group_route(scope, heartbeat_fast_path.SUFFIX)
        if group_id is not None:
            scope["app"] = self
            routed = super().__call__
            tracer = self.state.route_tracer
            if tracer is None:
                await heartbeat_fast_path.serve_fast_path(scope, receive, send, group_id, routed)
                return

            async def serve(answering: Send) -> None:
                await heartbeat_fast_path.serve_fast_path(
                    scope, receive, answering, group_id, routed
                )

            await traced_route(tracer, scope, heartbeat_fast_path.ROUTE, serve, send)
            return
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            declare_problems(super().openapi())
        return super().openapi()


async def _refuse(exc: KeyrangeError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer a request refused before routing, counted as ``RouteMetrics`` counts requests
    no route matched."""
    response = error_response(exc)
    await response(scope, receive, send)
    metrics.HTTP_REQUESTS.labels(scope["method"], "unmatched", str(response.status_code)).inc()


def create_app(
    settings: Settings,
    database_url: str,
    background: dict[str, BackgroundLoop] | None = None,
) -> FastAPI:
    from coordinator.admin.endpoints import router as admin_router
    from coordinator.admin.members import router as groups_admin_router
    from coordinator.admin.scaling import router as scaling_router
    from coordinator.groups.endpoints import router as groups_router
    from coordinator.groups.loops import background_loops
    from coordinator.health.endpoints import router as health_router
    from coordinator.limits import router as limits_router
    from coordinator.mirror import mirror_loops
    from coordinator.offsets.endpoints import router as offsets_router
    from coordinator.offsets.log_end import router as out_of_range_router
    from coordinator.record_age import record_age_loops
    from coordinator.ui.router import router as ui_router

    loops = dict(background_loops(settings) if background is None else background)
    if background is None:
        loops.update(mirror_loops(settings))
        loops.update(record_age_loops(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.engine = make_engine(database_url, settings)
        app.state.cluster = await _connect_cluster(settings)
        app.state.commits = CommitBatcher(app.state.engine, settings)
        app.state.commits.start()
        try:
            await _seed_switches(app)
            tasks = [
                asyncio.create_task(_run_forever(name, loop, app), name=name)
                for name, loop in loops.items()
            ]
            tune_gc_for_serving()
            log.info("coordinator ready", extra={"loops": sorted(loops)})
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await app.state.commits.close()
            if app.state.cluster is not None:
                await app.state.cluster.close()
            await app.state.engine.dispose()
            log.info("coordinator stopped")

    app = CoordinatorApp(
        title="Keyrange coordinator",
        version="0.1.0",
        description="Cooperative key-range consumption for Apache Kafka. See docs/api.md.",
        lifespan=lifespan,
        docs_url=None,  # served offline by coordinator/ui/docs.py
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.membership_watch = MembershipWatch()
    app.state.group_turns = GroupTurns()
    # Two refresh intervals: each replica's refresh notes every stored count once per interval.
    app.state.stored_topics = StoredTopics(2 * settings.metadata_refresh_ms / 1000)
    app.state.scaling_histories = {}
    # The console's lag and throughput charts, per group (coordinator.core.trend).
    app.state.console_trends = {}
    # Spans of the routes served ahead of FastAPI (commits, heartbeats); None when tracing is off.
    app.state.route_tracer = route_tracer()
    app.state.on_max_ic_reached = _rebalance_on_max_ic(app)
    _install_error_handlers(app)
    app.include_router(offsets_router)
    app.include_router(out_of_range_router)
    app.include_router(health_router)
    app.include_router(groups_router)
    app.include_router(admin_router)
    app.include_router(groups_admin_router)
    app.include_router(scaling_router)
    app.include_router(limits_router)
    app.include_router(ui_router)
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    app.add_middleware(RouteMetrics)
    _trace_routes(app)
    return app


def _trace_routes(app: FastAPI) -> None:
    """A span per request (OpenTelemetry's FastAPI instrumentation, from ``keyrange[otel]``)
    when a tracer provider is set up: a slow commit then shows where its time went, with the
    commit path's own spans under it (``coordinator.offsets``). Nothing without the extra."""
    if not tracing_enabled():
        return
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError:
        return
    # Health probes and scrapes every few seconds would be most of the traces.
    FastAPIInstrumentor.instrument_app(app, excluded_urls="livez,readyz,metrics")
