"""The console's routes. The pages are empty shells anyone may load; everything they show
comes from fragments that need the admin scope, fetched by the page's JavaScript with the
token the operator entered (kept in the tab's sessionStorage, sent as a bearer header). The
fragments are the admin API's own replies (the route functions of ``coordinator/admin``,
called as they are) rendered to HTML, so the console shows nothing the API would not."""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from starlette.exceptions import HTTPException

from coordinator.admin.endpoints import get_topic_config, list_groups
from coordinator.admin.lag import admin_offsets
from coordinator.admin.members import describe_group
from coordinator.admin.schemas import AdminGroupDescription
from coordinator.core.trend import GroupTrend
from coordinator.db.engine import Transaction
from coordinator.errors import GroupIdNotFound
from coordinator.offsets import repository as offsets_repository
from coordinator.ui.pages import STATIC_DIR, STATIC_FILES, templates
from coordinator.ui.views import group_page, group_rows, topics_of, trend_sample
from coordinator.validation import GroupId

log = logging.getLogger(__name__)

# How often a page fetches its fragment again: quick enough to watch a hand-off happen, slow
# enough that an open tab costs the coordinator a few cheap reads a second at most.
REFRESH_MS = 2_000

# Nothing but this origin: no asset, font or connection elsewhere, no inline script, and the
# console cannot be framed by another site.
CONSOLE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)

router = APIRouter(include_in_schema=False)
# Admin scope, checked at the edge with every other route (``coordinator.auth.admit``).
fragments = APIRouter(prefix="/ui/fragments")

Connection = Transaction
GroupPath = Annotated[GroupId, PathParam()]


def _html(template: str, **values: object) -> HTMLResponse:
    return HTMLResponse(
        templates.get_template(template).render(**values),
        headers={
            "Content-Security-Policy": CONSOLE_POLICY,
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
        },
    )


def _shell(request: Request, title: str, fragment: str) -> HTMLResponse:
    base = request.scope.get("root_path", "")
    return _html(
        "shell.html", base=base, title=title, fragment=base + fragment, refresh_ms=REFRESH_MS
    )


@router.get("/", include_in_schema=False)
async def root(request: Request) -> RedirectResponse:
    """A newcomer opening the coordinator's address lands on its console, not on a 404."""
    return RedirectResponse(request.scope.get("root_path", "") + "/ui", status_code=307)


@router.get("/ui", response_class=HTMLResponse)
async def groups_page(request: Request) -> HTMLResponse:
    return _shell(request, "Groups", "/ui/fragments/groups")


@router.get("/ui/groups/{group_id}", response_class=HTMLResponse)
async def group_shell(request: Request, group_id: GroupPath) -> HTMLResponse:
    return _shell(request, f"Group {group_id}", f"/ui/fragments/groups/{group_id}")


@router.get("/ui/static/{name}")
async def static_file(name: str) -> FileResponse:
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        raise HTTPException(404, f"no console asset named '{name}'")
    return FileResponse(
        STATIC_DIR / name, media_type=media_type, headers={"Cache-Control": "no-cache"}
    )


@fragments.get("/groups", response_class=HTMLResponse)
async def groups_fragment(request: Request, connection: Connection) -> HTMLResponse:
    summaries = (await list_groups(connection)).groups
    stored = [
        await offsets_repository.read_partitions(connection, summary.group_id)
        for summary in summaries
    ]
    # One high-watermark lookup for every group's partitions, then split back per group.
    flat = await admin_offsets(request, [item for partitions in stored for item in partitions])
    per_group = []
    for partitions in stored:
        per_group.append(flat[: len(partitions)])
        flat = flat[len(partitions) :]
    return _html(
        "groups.html",
        base=request.scope.get("root_path", ""),
        groups=group_rows(summaries, per_group),
    )


@fragments.get("/groups/{group_id}", response_class=HTMLResponse)
async def group_fragment(
    request: Request, group_id: GroupPath, connection: Connection
) -> HTMLResponse:
    trends: dict[str, GroupTrend] = request.app.state.console_trends
    try:
        description = await describe_group(request, group_id, connection)
    except GroupIdNotFound:
        trends.pop(group_id, None)
        raise
    configs = [
        await get_topic_config(request, topic, connection) for topic in topics_of(description)
    ]
    trend = trends.setdefault(group_id, GroupTrend())
    trend.add(trend_sample(description, time.monotonic()))
    log_starts = await _log_starts(request, description)
    return _html("group.html", page=group_page(description, configs, log_starts, trend))


async def _log_starts(
    request: Request, description: AdminGroupDescription
) -> dict[tuple[str, int], int]:
    """Where each partition's log starts, so its offset axis draws the whole log; without a
    Kafka cluster, or when it does not answer, every log is drawn from offset 0."""
    cluster = getattr(request.app.state, "cluster", None)
    partitions = [(item.topic, item.partition) for item in description.partitions]
    if cluster is None or not partitions:
        return {}
    try:
        found: dict[tuple[str, int], int] = await cluster.log_start_offsets(partitions)
    except Exception as exc:
        log.warning("log start offsets unavailable", extra={"error": type(exc).__name__})
        return {}
    return found


router.include_router(fragments)
