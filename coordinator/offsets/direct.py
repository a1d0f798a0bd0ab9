"""Commits answered by the HTTP protocol itself, with no ASGI task
(``coordinator/direct_routes.py`` says when, and how a request is handed to the ASGI path).

Once the body is complete the cycle runs the commit route's checks in its order, queues the
request with the batcher, and writes a plain 200 from the batch's callback; every other reply
(errors, a commit over the IC cap that asks for a rebalance) is written by the ASGI path's
answer, on a task. docs/offsets.md, "The commit's HTTP path".
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Scope

from coordinator.direct_routes import DirectCycle
from coordinator.offsets import fast_path
from coordinator.offsets.schemas import CommitRequest
from coordinator.offsets.service import CommitResult
from coordinator.settings import Settings


class DirectCommit(DirectCycle["tuple[str, CommitRequest, str]"]):
    """One commit's cycle."""

    route = fast_path.ROUTE

    def _checked(self, scope: Scope, settings: Settings) -> tuple[str, CommitRequest, str]:
        """The group id, the request and the tenant it counts against."""
        group_id = fast_path.checked_head(scope, settings, self._raw_group_id)
        request, principal = fast_path.checked_body(scope, settings, bytes(self.body))
        return group_id, request, principal.group_scope(group_id)

    def _serve(self, checked: tuple[str, CommitRequest, str]) -> None:
        group_id, request, tenant = checked
        reply = self._coordinator.state.commits.enqueue(group_id, request, tenant)
        reply.add_done_callback(lambda decided: self._answer(group_id, decided))

    def _answer(self, group_id: str, reply: asyncio.Future[CommitResult]) -> None:
        """Write a plain 200 here; anything else goes through the ASGI path's answer."""
        if reply.cancelled() or reply.exception() is not None or reply.result().rebalance_needed:
            self._hand_over(self._answering(group_id, reply))
            return
        self._reply_json(reply.result().body())
        fast_path.record(200, self._started)

    def _answering(self, group_id: str, reply: asyncio.Future[CommitResult]) -> Any:
        """An ASGI application answering ``reply`` as the ASGI path does."""

        async def answer(scope: Any, receive: Any, send: Any) -> None:
            status = await fast_path.serve_submitted(scope, receive, send, group_id, reply)
            fast_path.record(status, self._started)

        return answer
