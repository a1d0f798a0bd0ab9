"""Commits answered by the HTTP protocol itself, with no ASGI task.

Served through uvicorn's ASGI cycle, even by the bare handler in ``fast_path``, a commit cost
the coordinator about as much CPU again as its share of the batch that stores it: the scope and
message dicts, a task per request and its steps, the middleware chain. For the commit every
client of ours sends (HTTP/1.1 kept alive, a declared body of at most 64 KiB, no browser
headers, not pipelined behind another request, tracing off), the protocol
(``coordinator.serving.ReadDeadlines``) decides the request in its parser callbacks once the
body is complete, and writes the reply from the batch's callback.

Every check here is the ASGI path's own function, called in its order. A request that fails
one is handed to the ASGI path, which takes it from its start (the body is still buffered in
the cycle), so a refusal creates nothing and reads as it always did, problem document, metrics
and logs included; and every reply but a plain 200 is written by that path's answer, on a
task. docs/offsets.md, "The commit's HTTP path".
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING, Any, cast

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from coordinator.auth import admit
from coordinator.cross_origin import refuse_cross_origin
from coordinator.offsets import fast_path
from coordinator.offsets.service import CommitResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.applications import Starlette
    from starlette.types import Scope
    from uvicorn._types import ASGI3Application
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    # How the protocol runs an application on a cycle, as it runs any request's.
    StartAsgi = Callable[[RequestResponseCycle, ASGI3Application], None]

_PREFIX = fast_path.ROUTE.partition("{group_id}")[0].encode()
_SUFFIX = fast_path.ROUTE.partition("{group_id}")[2].encode()
# Headers whose requests the ASGI path answers: a browser's (the cross-origin refusal is
# that path's business), and those that change how the body or the connection is read.
_HANDED_OVER = frozenset(
    {b"origin", b"sec-fetch-site", b"expect", b"transfer-encoding", b"upgrade"}
)
# The group ids the route accepts (``coordinator.validation.GroupId``), undecoded: the others
# need percent-decoding or a refusal.
_GROUP_ID = re.compile(rb"[A-Za-z0-9._-]{1,255}")
_OK_HEAD = STATUS_LINE[200]
_JSON_HEAD = b"content-type: application/json\r\ncontent-length: "


class DirectCommits:
    """The coordinator's commits as the protocol answers them; one per served app, whose
    commit tracing is off (``coordinator/serving.py`` makes none otherwise: a traced commit
    takes the ASGI path, which records its spans)."""

    def __init__(self, app: Starlette) -> None:
        self._app = app
        # uvicorn pauses reading once a cycle buffers more than HIGH_WATER_LIMIT bytes of body
        # and resumes it only when the application reads: no body here may reach that.
        self._largest_body = min(HIGH_WATER_LIMIT, app.state.settings.max_body_bytes)

    def begin(self, protocol: HttpToolsProtocol, start_asgi: StartAsgi) -> DirectCommit | None:
        """A cycle for the request whose headers ``protocol`` just parsed, when this path
        answers it; None leaves it to uvicorn's ASGI cycle."""
        if protocol.cycle is not None and not protocol.cycle.response_complete:
            return None  # pipelined behind a request not answered yet: uvicorn queues it
        parser = protocol.parser
        if (
            parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
            or not parser.should_keep_alive()
            or protocol.root_path
        ):
            return None
        url: bytes = protocol.url
        if not (url.startswith(_PREFIX) and url.endswith(_SUFFIX)):
            return None
        raw_group = url[len(_PREFIX) : len(url) - len(_SUFFIX)]
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
        path = url.decode("ascii")
        scope["method"] = "POST"
        scope["path"] = path
        scope["raw_path"] = url
        scope["query_string"] = b""
        scope["app"] = self._app  # as CoordinatorApp sets it for the fast path
        return DirectCommit(self._app, protocol, start_asgi, raw_group.decode("ascii"))


class DirectCommit(RequestResponseCycle):
    """One commit's cycle: uvicorn's parser callbacks fill its body as for any cycle, and
    ``decide`` runs when the body is complete instead of an ASGI task."""

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
        """Check and submit the commit, or hand it to the ASGI path; once, at the body's
        end."""
        if self._decided:
            return
        self._decided = True
        scope = cast("Scope", self.scope)
        state = self._coordinator.state
        settings = state.settings
        try:
            refuse_cross_origin(scope)
            admit(settings, scope)
            group_id = fast_path.checked_head(scope, settings, self._raw_group_id)
            request, principal = fast_path.checked_body(scope, settings, bytes(self.body))
            tenant = principal.group_scope(group_id)
        except Exception:
            self._start_asgi(self, self._asgi_app)
            return
        reply = state.commits.enqueue(group_id, request, tenant)
        reply.add_done_callback(lambda decided: self._answer(group_id, decided))

    def _answer(self, group_id: str, reply: asyncio.Future[CommitResult]) -> None:
        """Write a plain 200 here; anything else goes through the ASGI path's answer."""
        if (
            reply.cancelled()
            or reply.exception() is not None
            or reply.result().rebalance_needed
            or self.flow.write_paused
        ):
            self._start_asgi(self, self._answering(group_id, reply))
            return
        if not self.disconnected:
            self._write(reply.result().body())
        fast_path.record(200, self._started)

    def _answering(self, group_id: str, reply: asyncio.Future[CommitResult]) -> Any:
        """An ASGI application answering ``reply`` as the ASGI path does."""

        async def answer(scope: Any, receive: Any, send: Any) -> None:
            status = await fast_path.serve_submitted(scope, receive, send, group_id, reply)
            fast_path.record(status, self._started)

        return answer

    def _write(self, body: bytes) -> None:
        """The reply as uvicorn's ``send`` writes it, default headers included, and the end
        of the cycle as ``send`` ends it."""
        head = [_OK_HEAD]
        for name, value in self.default_headers:
            head += (name, b": ", value, b"\r\n")
        head += (_JSON_HEAD, b"%d" % len(body), b"\r\n")
        if not self.keep_alive:  # the server began shutting down during the commit
            head.append(b"connection: close\r\n")
        head += (b"\r\n", body)
        self.transport.write(b"".join(head))
        self.response_started = True
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
