"""The query routes of a streams instance, answered on the event loop (docs/api.md, "Streams
instances"):

- ``GET /v1/stores/{store}/keys/{key}``: a key's value;
- ``GET /v1/stores/{store}/keys/{key}/windows?from_ms=&to_ms=``: a key's windows (window
  stores);
- ``GET /v1/stores/{store}/range?from=&to=&limit=``: this instance's keys in a key range;
- ``GET /v1/stores/{store}/windows?from=&to=&from_ms=&to_ms=&limit=``: this instance's
  windows of a key range in a time range (window stores).

A key is given as its serialized bytes (what the store's key serde writes), as UTF-8 text
percent-encoded in the path, or base64url with ``key_encoding=base64``. A key this instance
does not own is forwarded to its owner's advertised endpoint and the owner's JSON answer
returned; with ``redirect=true`` the answer is a 307 to it instead. Either way only the
route's own parameters go on, and the caller's credential never does: the caller was
checked here, and the forward presents this instance's own token, as a Kafka Streams
application's RPC layer calls its peers as itself (docs/security.md, "Queries over HTTP").
A request already forwarded once is never forwarded again: a hand-off moving the key
meanwhile is a 503 to retry, not a loop.

Scans read on a thread of their own (``scans``), never on the event loop the heartbeats and
rounds run on, and stop at ``limit + 1`` entries of what the stores would list.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote_to_bytes, urlencode

import httpx

from client.http import KeyOwner
from client.streams.errors import StreamsError, UnknownStore
from client.streams.queries import Located, NotAKeyValueStore, NotAWindowStore, StoreQueries
from client.streams.serde import Serde

DEFAULT_LIMIT = 1_000
MAX_LIMIT = 10_000
TIME_MAX = 2**63 - 1
logger = logging.getLogger(__name__)

_PROBLEM = "application/problem+json"
# What a one-key request may carry on to the key's owner: the route's own parameters, none
# of the caller's others.
ONWARD_PARAMS = ("key_encoding", "from_ms", "to_ms")
# The answers relayed from an owner: our own routes' documents. Anything else (an address
# that is no Keyrange instance) is not passed back to the caller.
_RELAYED_TYPES = ("application/json", _PROBLEM)


@dataclass(frozen=True)
class Request:
    path: str
    query: str
    authorization: str | None = None
    forwarded_by: str | None = None


@dataclass(frozen=True)
class Answer:
    """``body`` is a JSON document, or bytes relayed as they came (``raw``)."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    raw: bool = False

    @classmethod
    def problem(
        cls, status: int, error: str, detail: str, *, retry_after: int | None = None, **extra: Any
    ) -> Answer:
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        document = {"status": status, "error": error, "detail": detail, **extra}
        return cls(status, document, headers, _PROBLEM)


class _BadRequest(Exception):
    pass


class _StoreChanged(Exception):
    """A scan met its stores changing under it (a revocation closing one, a window segment
    dropped): the caller retries."""


class Routes:
    FORWARDED_HEADER = "Keyrange-Forwarded-By"

    def __init__(
        self,
        queries: StoreQueries,
        http: httpx.AsyncClient,
        name: Callable[[], str | None],
        *,
        credential: str | None,
        scans: Executor,
    ) -> None:
        """``credential``: this instance's own coordinator token, the one its forwards present
        (None: the coordinator has no tokens); ``scans``: where scans read the stores."""
        self._queries = queries
        self._http = http
        self._name = name
        self._credential = credential
        self._scans = scans

    async def answer(self, request: Request) -> Answer:
        segments = request.path.split("/")
        params = {k: v[-1] for k, v in parse_qs(request.query, keep_blank_values=True).items()}
        try:
            if len(segments) < 5 or segments[:3] != ["", "v1", "stores"]:
                return Answer.problem(404, "NOT_FOUND", f"no route {request.path}")
            store = unquote_to_bytes(segments[3]).decode("utf-8", "replace")
            spec = self._queries.spec(store)
            rest = segments[4:]
            if rest == ["range"]:
                return await self._range(store, spec.key_serde, params)
            if rest == ["windows"]:
                return await self._window_range(store, spec.key_serde, params)
            if rest[0] == "keys" and len(rest) in (2, 3) and rest[2:] in ([], ["windows"]):
                raw_key = unquote_to_bytes(rest[1])
                key = _key(spec.key_serde, raw_key, params)
                windows = len(rest) == 3
                onward = f"/v1/stores/{quote(store, safe='')}/keys/{quote(raw_key, safe='')}"
                onward += "/windows" if windows else ""
                return await self._one_key(request, onward, store, key, params, windows=windows)
            return Answer.problem(404, "NOT_FOUND", f"no route {request.path}")
        except UnknownStore as error:
            return Answer.problem(404, "UNKNOWN_STORE", str(error).strip("'\""))
        except NotAWindowStore as error:
            return Answer.problem(400, "NOT_A_WINDOW_STORE", str(error))
        except NotAKeyValueStore as error:
            return Answer.problem(400, "NOT_A_KEY_VALUE_STORE", str(error))
        except (_BadRequest, StreamsError) as error:
            return Answer.problem(400, "INVALID_REQUEST", str(error))
        except _StoreChanged as error:
            return Answer.problem(503, "STORE_CHANGED", str(error), retry_after=1)

    async def _one_key(
        self,
        request: Request,
        onward: str,
        store: str,
        key: Any,
        params: dict[str, str],
        *,
        windows: bool,
    ) -> Answer:
        """``onward``: the request's path rebuilt from the store and key it named, for the
        key's owner."""
        located = self._queries.locate(store, key)
        if located.task is None:
            return await self._elsewhere(request, onward, located, params)
        served = {"store": store, **_rendered("key", key, located.spec.key_serde)}
        served["served_by"] = self._name()
        if windows:
            time_from, time_to = _times(params)
            found = self._queries.windows(located, key, time_from, time_to)
            served["windows"] = [
                {
                    "start": start,
                    "end": end,
                    **_rendered("value", value, located.spec.value_serde),
                }
                for start, end, value in found
            ]
            return Answer(200, served)
        value = located.task.stores[store].get(key)
        if value is None:
            return Answer.problem(404, "KEY_NOT_FOUND", f"no value for the key in '{store}'")
        return Answer(200, {**served, **_rendered("value", value, located.spec.value_serde)})

    async def _elsewhere(
        self, request: Request, onward: str, located: Located, params: dict[str, str]
    ) -> Answer:
        """A key this instance does not own now: forward, redirect, or say who to retry."""
        if request.forwarded_by is not None:
            return Answer.problem(
                503,
                "NOT_OWNER",
                f"forwarded by {request.forwarded_by}, but the key moved; retry",
                retry_after=1,
            )
        owner = await self._queries.owner(located)
        if owner is None or owner.name == self._name():
            # Nobody owns it, or the coordinator says this instance does while its task is
            # not running yet (restoring, or the hand-off not done here): both pass, and the
            # retry asks the coordinator afresh.
            if owner is not None:
                self._queries.forget_owners()
            return Answer.problem(
                503, "NO_OWNER_NOW", "the key is being handed over; retry", retry_after=1
            )
        if owner.endpoint is None:
            return Answer.problem(
                503,
                "OWNER_NOT_SERVING",
                f"{owner.name} owns the key and serves no queries",
                owner=owner.name,
                retry_after=1,
            )
        target = f"{owner.endpoint}{onward}"
        known = {name: params[name] for name in ONWARD_PARAMS if name in params}
        if known:
            target += f"?{urlencode(known)}"
        if params.get("redirect", "false") == "true":
            document = {"owner": owner.name, "endpoint": owner.endpoint}
            return Answer(307, document, {"Location": target})
        return await self._forward(owner, target)

    async def _forward(self, owner: KeyOwner, target: str) -> Answer:
        headers = {self.FORWARDED_HEADER: self._name() or "-"}
        if self._credential is not None:
            headers["Authorization"] = f"Bearer {self._credential}"
        try:
            reply = await self._http.get(target, headers=headers)
        except httpx.HTTPError as error:
            self._queries.forget_owners()
            return Answer.problem(
                502,
                "OWNER_UNREACHABLE",
                f"{owner.name} at {owner.endpoint}: {type(error).__name__}",
                owner=owner.name,
                retry_after=1,
            )
        if reply.status_code == 503:
            # The owner named no longer owns the key (or cannot answer now): the next query
            # asks the coordinator who does.
            self._queries.forget_owners()
        content_type = reply.headers.get("Content-Type", "")
        if content_type.partition(";")[0].strip().lower() not in _RELAYED_TYPES:
            return Answer.problem(
                502,
                "OWNER_UNREACHABLE",
                f"{owner.name} at {owner.endpoint} answered no query document",
                owner=owner.name,
                retry_after=1,
            )
        relayed = {name: reply.headers[name] for name in ("Retry-After",) if name in reply.headers}
        return Answer(reply.status_code, reply.content, relayed, content_type, raw=True)

    async def _range(self, store: str, serde: Serde, params: dict[str, str]) -> Answer:
        low, high = _bounds(serde, params)
        limit = _limit(params)
        pairs = await self._scanned(self._queries.range_scan(store, low, high, limit + 1))
        entries = [
            {**_rendered("key", key, serde), **_rendered("value", value, self._values(store))}
            for key, value in pairs[:limit]
        ]
        return Answer(200, self._listing(store, entries, len(pairs) > limit))

    async def _window_range(self, store: str, serde: Serde, params: dict[str, str]) -> Answer:
        low, high = _bounds(serde, params)
        time_from, time_to = _times(params)
        limit = _limit(params)
        found = await self._scanned(
            self._queries.window_scan(store, low, high, time_from, time_to, limit + 1)
        )
        entries = [
            {
                **_rendered("key", key, serde),
                "start": start,
                "end": end,
                **_rendered("value", value, self._values(store)),
            }
            for key, start, end, value in found[:limit]
        ]
        return Answer(200, self._listing(store, entries, len(found) > limit))

    async def _scanned(self, scan: Callable[[], list[Any]]) -> list[Any]:
        """A scan's entries, read on the scans' threads: the loop meanwhile heartbeats and
        runs rounds, however big the store (a store of millions took the loop seconds)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._scans, scan)
        except Exception as error:
            # Off the loop, the tasks chosen may be revoked and their stores closed while
            # the scan reads: whatever the store then raises means "ask again".
            logger.info("a scan failed as its stores changed", exc_info=True)
            raise _StoreChanged(f"the stores changed during the scan; retry ({error})") from None

    def _listing(self, store: str, entries: list[dict[str, Any]], truncated: bool) -> Any:
        """A scan's answer: this instance's part only, which ``served_by`` names."""
        return {
            "store": store,
            "served_by": self._name(),
            "entries": entries,
            "truncated": truncated,
        }

    def _values(self, store: str) -> Serde:
        return self._queries.spec(store).value_serde


def _key(serde: Serde, raw: bytes, params: dict[str, str]) -> Any:
    """A key from its serialized bytes as the caller wrote them."""
    encoding = params.get("key_encoding", "utf-8")
    if encoding == "base64":
        try:
            raw = base64.b64decode(raw + b"=" * (-len(raw) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise _BadRequest("the key is not base64url") from None
    elif encoding != "utf-8":
        raise _BadRequest("key_encoding is utf-8 or base64")
    try:
        key = serde.deserialize(raw)
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        raise _BadRequest(f"the key's serde cannot read it: {error}") from None
    if key is None:
        raise _BadRequest("a store key cannot be None")
    return key


def _bounds(serde: Serde, params: dict[str, str]) -> tuple[Any, Any]:
    """A scan's inclusive key bounds: both, or neither (every key)."""
    if ("from" in params) != ("to" in params):
        raise _BadRequest("give both from and to, or neither")
    if "from" not in params:
        return None, None
    return (
        _key(serde, params["from"].encode(), params),
        _key(serde, params["to"].encode(), params),
    )


def _times(params: dict[str, str]) -> tuple[int, int]:
    try:
        time_from = int(params.get("from_ms", 0))
        time_to = int(params.get("to_ms", TIME_MAX))
    except ValueError:
        raise _BadRequest("from_ms and to_ms are integers (ms)") from None
    if not 0 <= time_from <= time_to <= TIME_MAX:
        raise _BadRequest("0 <= from_ms <= to_ms is required")
    return time_from, time_to


def _limit(params: dict[str, str]) -> int:
    try:
        limit = int(params.get("limit", DEFAULT_LIMIT))
    except ValueError:
        raise _BadRequest("limit is an integer") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise _BadRequest(f"limit is 1..{MAX_LIMIT}")
    return limit


def _rendered(name: str, value: Any, serde: Serde) -> dict[str, Any]:
    """``{name: value}`` when JSON can say it, else ``{name_base64: its serialized bytes}``
    (an ``Int64Serde`` key stays a number, a ``BytesSerde`` value becomes base64url)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raw = serde.serialize(value) or b""
        return {f"{name}_base64": base64.urlsafe_b64encode(raw).decode()}
    return {name: value}
