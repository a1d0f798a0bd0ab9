"""Who may query a streams instance: whoever the coordinator would let use the application's
group (docs/streams.md, "Queries over HTTP").

The instance keeps no tokens of its own. It asks the coordinator with the caller's
``Authorization`` header (a read of the group's committed offsets for one partition, which
any token of the group may make and which changes nothing), and keeps the verdict for
``VERDICT_TTL_S``, by a digest of the header, never the header itself. So the coordinator's
tokens, prefixes and rotation apply unchanged, a revoked token is refused here within
``VERDICT_TTL_S``, and a coordinator without tokens (every caller an admin, on loopback)
admits every caller here too. A coordinator that cannot answer admits nobody, and so does a
404 that does not carry the coordinator's own ``GROUP_ID_NOT_FOUND`` (a proxy's or a wrong
``coordinator_url``'s 404 says nothing of the caller).

What callers can make the instance ask of the coordinator is bounded: concurrent checks of
one header share one request, and at most ``MAX_CHECKS_IN_FLIGHT`` requests are out at once
(the others wait their turn), so a flood of made-up tokens costs the coordinator that many
reads at a time, not one per query in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass

import httpx

from client.protocol.error_names import GROUP_ID_NOT_FOUND

# How long a verdict holds: the delay before a revoked token is refused here, against one
# coordinator read per caller per this long.
VERDICT_TTL_S = 30.0
# Verdicts kept at most; past it the expired go, then all of them (a flood of tokens).
MAX_VERDICTS = 10_000
# Coordinator reads at once for callers' checks: a few cover a burst of new callers, well
# below the 64 queries a server has in flight.
MAX_CHECKS_IN_FLIGHT = 4


@dataclass(frozen=True)
class Refusal:
    """Why a caller is refused: the HTTP status, the coordinator's error name, a detail."""

    status: int
    error: str
    detail: str


class CallerCheck:
    """Asks the coordinator at ``coordinator_url`` whether a caller may use ``group_id``,
    through ``http`` (which sends no credentials of its own)."""

    def __init__(
        self, http: httpx.AsyncClient, coordinator_url: str, group_id: str, topic: str
    ) -> None:
        self._http = http
        self._url = f"{coordinator_url.rstrip('/')}/v1/groups/{group_id}/offsets"
        self._params: dict[str, str | int] = {"topic": topic, "partition": 0}
        self._verdicts: dict[bytes, tuple[Refusal | None, float]] = {}
        self._asking: dict[bytes, asyncio.Future[Refusal | None]] = {}
        self._turns = asyncio.Semaphore(MAX_CHECKS_IN_FLIGHT)

    async def refusal(self, authorization: str | None) -> Refusal | None:
        """None when the caller may query, else why not."""
        digest = hashlib.sha256((authorization or "").encode("latin-1", "replace")).digest()
        kept = self._verdicts.get(digest)
        if kept is not None and kept[1] > time.monotonic():
            return kept[0]
        asking = self._asking.get(digest)
        if asking is None:
            asking = asyncio.ensure_future(self._ask(digest, authorization))
            self._asking[digest] = asking
            asking.add_done_callback(lambda _: self._asking.pop(digest, None))
        return await asyncio.shield(asking)

    async def _ask(self, digest: bytes, authorization: str | None) -> Refusal | None:
        headers = {} if authorization is None else {"Authorization": authorization}
        async with self._turns:
            try:
                reply = await self._http.get(self._url, params=self._params, headers=headers)
            except httpx.HTTPError as error:
                return Refusal(503, "COORDINATOR_UNAVAILABLE", f"cannot check the token: {error}")
        if reply.status_code in (401, 403):
            verdict: Refusal | None = Refusal(reply.status_code, *_problem(reply))
        elif reply.is_success:
            verdict = None
        elif reply.status_code == 404 and _problem(reply)[0] == GROUP_ID_NOT_FOUND:
            # The group does not exist yet: the coordinator checked the token for it first.
            verdict = None
        else:
            detail = f"cannot check the token: the coordinator answered {reply.status_code}"
            if reply.status_code == 404:
                detail += " without its error name (is coordinator_url right?)"
            return Refusal(503, "COORDINATOR_UNAVAILABLE", detail)
        self._keep(digest, verdict, time.monotonic())
        return verdict

    def _keep(self, digest: bytes, verdict: Refusal | None, now: float) -> None:
        if len(self._verdicts) >= MAX_VERDICTS:
            self._verdicts = {k: v for k, v in self._verdicts.items() if v[1] > now}
            if len(self._verdicts) >= MAX_VERDICTS:
                self._verdicts.clear()
        self._verdicts[digest] = (verdict, now + VERDICT_TTL_S)


def _problem(reply: httpx.Response) -> tuple[str, str]:
    """The coordinator's error name and detail, as it said them."""
    try:
        document = reply.json()
    except ValueError:
        document = {}
    if not isinstance(document, dict):
        document = {}
    default = {401: "UNAUTHORIZED", 403: "FORBIDDEN"}.get(reply.status_code, "")
    return str(document.get("error") or default), str(document.get("detail") or default)
