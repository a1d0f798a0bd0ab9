"""Requests the HTTP protocol answers itself, with no ASGI task: the common commit
(``coordinator/offsets/direct.py``) and the stable member's heartbeat
(``coordinator/groups/direct.py``).

Served through uvicorn's ASGI cycle, even by the bare handlers ahead of FastAPI, each of those
requests cost the coordinator about as much CPU again as its own work: the scope and message
dicts, a task per request and its steps, the middleware chain. For the requests every client of
ours sends (HTTP/1.1 kept alive, a declared body of at most 64 KiB, no browser headers, not
pipelined behind another request, tracing off), the protocol
(``coordinator.serving.ReadDeadlines``) decides the request in its parser callbacks once the
body is complete, and writes the reply from a callback.

A route's cycle runs the ASGI path's own checks in that path's order. A request that fails one
is handed to the ASGI path, which takes it from its start (the body is still buffered in the
cycle), so a refusal reads as it always did, problem document, metrics and logs included.
docs/offsets.md, "The commit's HTTP path"; docs/membership.md, "The heartbeat's HTTP path".
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from starlette.types import Scope
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from coordinator.auth import admit
from coordinator.cross_origin import refuse_cross_origin
from coordinator.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.applications import Starlette
    from starlette.types import ASGIApp
    from uvicorn._types import ASGI3Application
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    # How the protocol runs an application on a cycle, as it runs any request's.
    StartAsgi = Callable[[RequestResponseCycle, ASGI3Application], None]

# Every route answered here, and by the fast paths ahead of FastAPI, is under this prefix,
# followed by the group id.
GROUP_ROUTES = "/v1/groups/{group_id}"
_PREFIX = GROUP_ROUTES.partition("{group_id}")[0]
_GROUPS_PREFIX = _PREFIX.encode()
# Headers whose requests the ASGI path answers: a browser's (the cross-origin refusal is
# that path's business), and those that change how the body or the connection is read.
_HANDED_OVER = frozenset(
    {b"origin", b"sec-fetch-site", b"expect", b"transfer-encoding", b"upgrade"}
)
# The group ids the routes accept (``coordinator.validation.GroupId``), undecoded: the others
# need percent-decoding or a refusal.
_GROUP_ID = re.compile(rb"[A-Za-z0-9._-]{1,255}")
_OK_HEAD = STATUS_LINE[200]
_JSON_HEAD = b"content-type: application/json\r\ncontent-length: "
_JSON_HEADERS = [(b"content-type", b"application/json")]
# What a route's checks make of a request, for its answer.
Checked = TypeVar("Checked")


def group_route(scope: Scope, suffix: str) -> str | None:
    """The raw group id of a ``POST`` to ``GROUP_ROUTES`` + ``suffix`` that a fast path
    ahead of FastAPI serves, else None (a request under a root path is the router's)."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    path: str = scope["path"]
    if not (path.startswith(_PREFIX) and path.endswith(suffix)):
        return None
    group_id = path[len(_PREFIX) : len(path) - len(suffix)]
    if not group_id or "/" in group_id:
        return None
    return group_id


class DirectCycle(RequestResponseCycle, Generic[Checked]):
    """One request's cycle: uvicorn's parser callbacks fill its body as for any cycle, and
    ``decide`` runs when the body is complete instead of an ASGI task."""

    # The route's path template, which starts with GROUP_ROUTES.
    route: ClassVar[str]

    def __init__(
        self,
        app: Starlette,
        protocol: HttpToolsProtocol,
        start_asgi: StartAsgi,
        raw_group_id: str,
    ) -> None:
        super().__init__(
            scope=protocol.scope,
            transport=protocol.transport,
            flow=protocol.flow,
            logger=protocol.logger,
            access_logger=protocol.access_logger,
            access_log=False,
            default_headers=protocol.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=True,
            on_response=protocol.on_response_complete,
        )
        self._coordinator = app
        # The protocol's application (uvicorn's middlewares around ``app``) and how it starts
        # one: the ASGI path a request is handed to.
        self._asgi_app = protocol.app
        self._start_asgi = start_asgi
        self._raw_group_id = raw_group_id
        self._started = time.perf_counter()
        self._decided = False

    def decide(self) -> None:
        """Check the request and answer it, or hand it to the ASGI path; once, at the body's
        end (uvicorn
        calls the parser's callback once per message; answering twice would be worse than
        this check)."""
        if self._decided:
            return
        self._decided = True
        scope = self._scope
        settings = self._coordinator.state.settings
        try:
            refuse_cross_origin(scope)
            admit(settings, scope)
            checked = self._checked(scope, settings)
        except Exception:
            self._hand_over()
            return
        self._serve(checked)

    # Not abstract methods: the protocol tests every request's cycle against this class, and
    # an ABC's ``isinstance`` costs a call into Python.

    def _checked(self, scope: Scope, settings: Settings) -> Checked:
        """The request as the route's own checks pass it, in the route's order; they come
        after the cross-origin refusal and the token, as ``CoordinatorApp`` runs them.
        Raises for anything the ASGI path would refuse, or serves otherwise."""
        raise NotImplementedError

    def _serve(self, checked: Checked) -> None:
        """Answer the checked request, or hand it over."""
        raise NotImplementedError

    @property
    def _scope(self) -> Scope:
        return cast("Scope", self.scope)

    def _hand_over(self, app: ASGIApp | None = None) -> None:
        """Let ``app`` answer on a task, as uvicorn runs any request; by default the whole
        ASGI path, from the request's start."""
        self._start_asgi(self, cast("ASGI3Application", self._asgi_app if app is None else app))

    def _reply_json(self, body: bytes) -> None:
        """A 200 with ``body``: written here, or sent from a task when the transport is
        paused (``send`` waits for it to drain; a callback cannot)."""
        if self.disconnected:
            return
        if self.flow.write_paused:
            self._hand_over(_Sending(body))
            return
        self._write(body)

    def _write(self, body: bytes) -> None:
        """The reply as uvicorn's ``send`` writes it, default headers included, and the end
        of the cycle as ``send`` ends it."""
        head = [_OK_HEAD]
        for name, value in self.default_headers:
            head += (name, b": ", value, b"\r\n")
        head += (_JSON_HEAD, b"%d" % len(body), b"\r\n")
        if not self.keep_alive:  # the server began shutting down during the request
            head.append(b"connection: close\r\n")
        head += (b"\r\n", body)
        self.transport.write(b"".join(head))
        self.response_started = True
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()


class _Sending:
    """An ASGI application sending one JSON 200."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(self._body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self._body})


class DirectRoutes:
    """The routes the protocol answers for one served app, whose tracing is off
    (``coordinator/serving.py`` makes none otherwise: a traced request takes the ASGI path,
    which records its spans)."""

    def __init__(self, app: Starlette, cycles: Iterable[type[DirectCycle[Any]]]) -> None:
        self._app = app
        # Each route's cycle, by the path after the group id.
        self._cycles: dict[bytes, type[DirectCycle[Any]]] = {}
        for cycle in cycles:
            head, _, tail = cycle.route.partition(GROUP_ROUTES)
            if head or not tail.startswith("/"):
                raise ValueError(f"{cycle.route} is not a route of one group")
            self._cycles[tail.encode()] = cycle
        # uvicorn pauses reading once a cycle buffers more than HIGH_WATER_LIMIT bytes of body
        # and resumes it only when the application reads: no body here may reach that.
        self._largest_body = min(HIGH_WATER_LIMIT, app.state.settings.max_body_bytes)

    def begin(self, protocol: HttpToolsProtocol, start_asgi: StartAsgi) -> DirectCycle[Any] | None:
        """A cycle for the request whose headers ``protocol`` just parsed, when this path
        answers it; None leaves it to uvicorn's ASGI cycle."""
        if protocol.cycle is not None and not protocol.cycle.response_complete:
            return None  # pipelined behind a request not answered yet: uvicorn queues it
        url: bytes = protocol.url
        if not url.startswith(_GROUPS_PREFIX):
            return None
        group_end = url.find(b"/", len(_GROUPS_PREFIX))
        cycle = None if group_end < 0 else self._cycles.get(url[group_end:])
        if cycle is None:
            return None
        parser = protocol.parser
        if (
            parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
            or not parser.should_keep_alive()
            or protocol.root_path
        ):
            return None
        raw_group = url[len(_GROUPS_PREFIX) : group_end]
        if _GROUP_ID.fullmatch(raw_group) is None:
            return None  # the ASGI path answers a group id it refuses, or decodes one
        declared: bytes | None = None
        for name, value in protocol.headers:
            if name == b"content-length":
                if declared is not None:
                    return None
                declared = value
            elif name in _HANDED_OVER:
                return None
        if declared is None or not declared.isdigit() or int(declared) > self._largest_body:
            return None
        scope = cast("Scope", protocol.scope)
        scope["method"] = "POST"
        scope["path"] = url.decode("ascii")
        scope["raw_path"] = url
        scope["query_string"] = b""
        scope["app"] = self._app  # as CoordinatorApp sets it for the fast paths
        return cycle(self._app, protocol, start_asgi, raw_group.decode("ascii"))
