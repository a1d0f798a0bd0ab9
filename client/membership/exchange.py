"""The member's side of the heartbeat route: who it is, what each request says, and what each
reply changes of that (docs/api.md, docs/membership.md "Epochs and fencing").

One route joins (epoch 0), heartbeats and leaves (epoch -1), in the manner of KIP-848. The
heartbeat loop decides *when* to send; this part decides *what*: the subscription and the
assignor only while joining, the member's id and epoch as the coordinator last gave them, and
on leaving, nothing but who leaves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from client.errors import KeyrangeClientError
from client.http import CoordinatorClient, HeartbeatReply, HeartbeatRequest, Slices, StuckCall
from client.protocol.epochs import JOIN_EPOCH, LEAVE_EPOCH

logger = logging.getLogger(__name__)


class Exchange:
    """The member's identity in one group and the heartbeat requests that carry it."""

    def __init__(
        self,
        client: CoordinatorClient,
        group_id: str,
        *,
        topics: Sequence[str],
        assignor: str,
        allow_individual_commit: bool,
        session_timeout_ms: int,
        instance_id: str | None,
        client_id: str | None,
        endpoint: str | None = None,
    ) -> None:
        self._client = client
        self.group_id = group_id
        self._topics = list(topics)
        self._assignor = assignor
        self._allow_individual_commit = allow_individual_commit
        self._requested_session_ms = session_timeout_ms
        self._instance_id = instance_id
        self._client_id = client_id
        # Advertised at every join, so a member fenced and joining again still has it.
        self._endpoint = endpoint
        self.member_id: str | None = None
        self.member_epoch = JOIN_EPOCH

    @property
    def joining(self) -> bool:
        return self.member_epoch == JOIN_EPOCH

    @property
    def request_timeout_s(self) -> float:
        return self._client.request_timeout_s

    def identity(self) -> tuple[str | None, int | None]:
        if self.member_id is None:
            return None, None
        return self.member_id, self.member_epoch

    def request(
        self,
        owned: Slices,
        wait_s: float,
        stuck: list[StuckCall] | None,
        standbys: Slices | None = None,
    ) -> HeartbeatRequest:
        """A join or a heartbeat, reporting ``owned`` (and ``stuck`` and ``standbys`` when
        given); it offers to wait ``wait_s`` for a change when that is at least a
        millisecond."""
        joining = self.joining
        return HeartbeatRequest(
            member_epoch=self.member_epoch,
            member_id=self.member_id,
            instance_id=self._instance_id,
            client_id=self._client_id,
            subscribed_topics=self._topics if joining else None,
            assignor=self._assignor if joining else None,
            allow_individual_commit=self._allow_individual_commit,
            session_timeout_ms=self._requested_session_ms,
            owned=owned,
            wait_ms=int(wait_s * 1000) or None,
            stuck=stuck,
            endpoint=self._endpoint if joining else None,
            standbys=standbys,
        )

    async def send(self, request: HeartbeatRequest, timeout_s: float) -> HeartbeatReply:
        return await asyncio.wait_for(self._client.heartbeat(self.group_id, request), timeout_s)

    def accept(self, reply: HeartbeatReply) -> bool:
        """Take the id and epoch a reply gives; True when either moved (a join, a new
        assignment that the member will soon report)."""
        moved = reply.member_id != self.member_id or reply.member_epoch != self.member_epoch
        if moved:
            logger.info(
                "member epoch changed",
                extra={
                    "group_id": self.group_id,
                    "member_id": reply.member_id,
                    "member_epoch": reply.member_epoch,
                },
            )
        self.member_id = reply.member_id
        self.member_epoch = reply.member_epoch
        return moved

    def forget(self) -> None:
        """The membership is over: the next request joins anew, with epoch 0."""
        self.member_id, self.member_epoch = None, JOIN_EPOCH

    async def leave(self, timeout_s: float) -> None:
        """Tell the coordinator, so the slices move without waiting for the session to
        expire; if it cannot be told, the session expires instead."""
        if self.member_id is None:
            return
        request = HeartbeatRequest(
            member_epoch=LEAVE_EPOCH,
            member_id=self.member_id,
            instance_id=self._instance_id,
            client_id=self._client_id,
        )
        try:
            await self.send(request, timeout_s)
        except (KeyrangeClientError, TimeoutError) as error:
            logger.warning(
                "leaving the group failed; the session will expire instead",
                extra={"group_id": self.group_id, "error": str(error)},
            )
        self.forget()
