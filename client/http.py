"""Async HTTP client for the coordinator's client routes (docs/api.md).

Every call that is safe to repeat is retried a bounded number of times on connection errors
and 5xx replies, with exponential backoff: commits are idempotent by design (docs/design.md §3: a
duplicate is accepted silently), offset fetches are reads, and heartbeats restate the
member's whole view. The one exception is an anonymous join (epoch 0, no member id, no
instance id): a retry after a lost reply would register a second member that then holds
slices until its session expires, so it is tried once and the caller's heartbeat loop decides.
Problem replies raise the ``client.errors`` class named by their ``error`` field.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx
from aiokafka.structs import TopicPartition

from client.errors import (
    CoordinatorUnavailable,
    GroupIdNotFound,
    InvalidRequest,
    KeyrangeClientError,
    error_for_name,
)
from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import KeyRange, normalize
from client.protocol.wire import ranges_from_wire, ranges_to_wire

logger = logging.getLogger(__name__)

_GROUP_ID = re.compile(r"[A-Za-z0-9._-]{1,255}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# Backoff starts small because most failures are a coordinator replica restarting behind a
# load balancer; the cap keeps a retrying heartbeat well inside a 10 s session timeout.
_BACKOFF_INITIAL_S = 0.1
_BACKOFF_MAX_S = 2.0
# A coordinator that stays away is worth one warning line per this many seconds, not one per
# retry (a few per second at the first backoff steps).
_RETRY_WARNING_INTERVAL_S = 10.0

Slices = dict[TopicPartition, list[KeyRange]]


@dataclass(frozen=True)
class Limits:
    """Per-request limits of the coordinator; the defaults are docs/design.md §3.1's."""

    max_ranges_per_request: int = 60_000


@dataclass(frozen=True, slots=True)
class PartitionCommit:
    """One partition's entry of a commit: IC ranges and/or watermarks, or a classic offset."""

    topic: str
    partition: int
    ranges: Sequence[tuple[int, int]] = ()
    watermarks: Sequence[Watermark] = ()
    offset: int | None = None
    metadata: str | None = None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"topic": self.topic, "partition": self.partition}
        if self.ranges:
            document["ranges"] = [[start, end] for start, end in self.ranges]
        if self.watermarks:
            document["watermarks"] = [piece.to_json() for piece in self.watermarks]
        if self.offset is not None:
            document["offset"] = self.offset
        if self.metadata is not None:
            document["metadata"] = self.metadata
        return document


@dataclass(frozen=True, slots=True)
class PartitionCommitReply:
    """Per-partition outcome; ``error`` is ``INDIVIDUAL_COMMIT_TOO_OLD``,
    ``MAX_INDIVIDUAL_COMMIT_REACHED`` or None, and the stable offset is always current."""

    topic: str
    partition: int
    error: str | None
    last_stable_offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class StuckCall:
    """A call of this member's user code still running on a key of a slice it was asked to
    give up: the key, and its slice, stay held until it ends (docs/design.md §5). The coordinator
    shows it to operators (docs/api.md, "Stuck calls")."""

    topic: str
    partition: int
    key_hash: int
    offset: int
    # Seconds the call has been running when the heartbeat is sent.
    running_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "key_hash": self.key_hash,
            "offset": self.offset,
            "running_s": self.running_s,
        }


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """Join (epoch 0), heartbeat (current epoch) or leave (epoch -1); None means unchanged."""

    member_epoch: int
    member_id: str | None = None
    instance_id: str | None = None
    client_id: str | None = None
    subscribed_topics: Sequence[str] | None = None
    subscribed_topic_regex: str | None = None
    assignor: str | None = None
    allow_individual_commit: bool | None = None
    session_timeout_ms: int | None = None
    owned: Mapping[TopicPartition, Sequence[KeyRange]] | None = None
    wait_ms: int | None = None
    # The member's stuck calls now; None leaves what it last reported, () clears it.
    stuck: Sequence[StuckCall] | None = None
    # Where the member serves queries (a streams instance's HTTP address); None leaves what
    # it last advertised.
    endpoint: str | None = None
    # The key ranges the member keeps warm standbys of; None leaves what it last reported,
    # an empty mapping clears it.
    standbys: Mapping[TopicPartition, Sequence[KeyRange]] | None = None

    def to_json(self) -> dict[str, Any]:
        # ``wait_ms`` only when offered, ``stuck`` and ``standbys`` only when reported and
        # ``endpoint`` only when advertised: coordinators older than any of them refuse fields
        # they do not know, and never see them from a member that has nothing to say.
        offer: dict[str, Any] = {} if self.wait_ms is None else {"wait_ms": self.wait_ms}
        if self.stuck is not None:
            offer["stuck"] = [call.to_json() for call in self.stuck]
        if self.endpoint is not None:
            offer["endpoint"] = self.endpoint
        if self.standbys is not None:
            offer["standbys"] = slices_to_json(self.standbys)
        return {
            "member_id": self.member_id,
            "member_epoch": self.member_epoch,
            "instance_id": self.instance_id,
            "client_id": self.client_id,
            "subscribed_topics": (
                None if self.subscribed_topics is None else list(self.subscribed_topics)
            ),
            "subscribed_topic_regex": self.subscribed_topic_regex,
            "assignor": self.assignor,
            "allow_individual_commit": self.allow_individual_commit,
            "session_timeout_ms": self.session_timeout_ms,
            "owned": None if self.owned is None else slices_to_json(self.owned),
            **offer,
        }


@dataclass(frozen=True, slots=True)
class KeyOwner:
    """The member owning a key: ``name`` is its instance id, else its member id (what people
    recognise); ``endpoint`` where it serves queries, None when it advertised none."""

    name: str
    member_id: str
    endpoint: str | None = None


@dataclass(frozen=True, slots=True)
class GroupOwners:
    """One description of a group, as who owns what: ``(topic, partition, first hash, last
    hash, owner)`` per owned range."""

    owned: tuple[tuple[str, int, int, int, KeyOwner], ...]

    def owner_of(self, topic: str, partition: int, hashed: int) -> KeyOwner | None:
        """The member owning key hash ``hashed`` of ``topic[partition]``, None while nobody
        does (a hand-off)."""
        for owned_topic, owned_partition, start, end, owner in self.owned:
            if (owned_topic, owned_partition) == (topic, partition) and start <= hashed <= end:
                return owner
        return None


@dataclass(frozen=True, slots=True)
class IdleNotice:
    """The coordinator's word that a member gets no partition because of a switch
    (``accept.range.fetch``, ``accept.individual.commit`` or ``allow.individual.commit``),
    with what to do about it."""

    switch: str
    topics: tuple[str, ...]
    message: str


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """``assignment`` is what the member may own now (docs/api.md), not the final target."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    session_timeout_ms: int
    assignment: Slices = field(default_factory=dict)
    # The coordinator asks for the next heartbeat at once: the reply already waited out the
    # interval, or something changed for this member while it waited.
    heartbeat_now: bool = False
    # Why the member was given nothing, when a coordinator switch is the cause.
    idle: IdleNotice | None = None

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> HeartbeatReply:
        idle = document.get("idle")
        return cls(
            member_id=str(document["member_id"]),
            member_epoch=int(document["member_epoch"]),
            heartbeat_interval_ms=int(document["heartbeat_interval_ms"]),
            session_timeout_ms=int(document["session_timeout_ms"]),
            assignment=slices_from_json(document.get("assignment") or []),
            heartbeat_now=bool(document.get("heartbeat_now", False)),
            idle=(
                None
                if not idle
                else IdleNotice(
                    switch=str(idle["switch"]),
                    topics=tuple(str(topic) for topic in idle["topics"]),
                    message=str(idle["message"]),
                )
            ),
        )


def slices_to_json(slices: Mapping[TopicPartition, Sequence[KeyRange]]) -> list[dict[str, Any]]:
    return ranges_to_wire({tp: normalize(ranges) for tp, ranges in slices.items()})


def slices_from_json(documents: Sequence[Mapping[str, Any]]) -> Slices:
    return {
        TopicPartition(topic, partition): ranges
        for (topic, partition), ranges in ranges_from_wire(documents).items()
    }


def checked_coordinator_url(url: str) -> str:
    """The coordinator's base URL, refused at once when it cannot be one: without a scheme
    (``127.0.0.1:8080``) httpx would read it as a relative path, and the start-up would retry
    it for its whole timeout before saying anything useful."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"coordinator URL {url!r} is not an http:// or https:// URL with a host "
            "(for example http://127.0.0.1:8080)"
        )
    return url.rstrip("/")


class CoordinatorClient:
    """One connection pool to the coordinator; use as ``async with`` or call ``aclose()``."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        base_url = checked_coordinator_url(base_url)
        headers = {"User-Agent": "keyrange-client/0.1", "Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
        )
        self._max_retries = max_retries
        self.request_timeout_s = timeout_s
        self._base_url = base_url
        self._retry_warned_at: float | None = None

    @property
    def base_url(self) -> str:
        return self._base_url

    async def __aenter__(self) -> CoordinatorClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def commit(
        self,
        group_id: str,
        partitions: Sequence[PartitionCommit],
        *,
        member_id: str | None = None,
        member_epoch: int | None = None,
    ) -> list[PartitionCommitReply]:
        """Commit atomically; no member id means a standalone consumer (docs/design.md §3.7)."""
        body = {
            "member_id": member_id,
            "member_epoch": member_epoch,
            "partitions": [partition.to_json() for partition in partitions],
        }
        document = await self._request(
            "POST", f"/v1/groups/{_checked_group(group_id)}/offsets/commit", json=body
        )
        return [
            PartitionCommitReply(
                topic=str(reply["topic"]),
                partition=int(reply["partition"]),
                error=reply.get("error"),
                last_stable_offset=int(reply["last_stable_offset"]),
            )
            for reply in document["partitions"]
        ]

    async def fetch_offsets(
        self,
        group_id: str,
        topics: Sequence[str] | None = None,
        *,
        partitions: Sequence[int] | None = None,
    ) -> dict[TopicPartition, CommittedOffsets]:
        """Committed state per partition; a partition never committed is absent."""
        params: list[tuple[str, str | int]] = [("topic", topic) for topic in topics or ()]
        if partitions is not None:
            if topics is None or len(topics) != 1:
                raise InvalidRequest("filtering by partition needs exactly one topic")
            params.extend(("partition", partition) for partition in partitions)
        document = await self._request(
            "GET", f"/v1/groups/{_checked_group(group_id)}/offsets", params=params
        )
        return {
            TopicPartition(str(entry["topic"]), int(entry["partition"])): (
                CommittedOffsets.from_json(entry)
            )
            for entry in document["partitions"]
        }

    async def reset_out_of_range(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int],
        *,
        member_id: str | None = None,
        member_epoch: int | None = None,
    ) -> dict[TopicPartition, CommittedOffsets]:
        """Move stored positions found past the log end to ``offsets`` (the reader's reset
        positions); the coordinator checks the log end itself and leaves any other state as it
        is. Returns the stored state of each partition afterwards; never committed: absent."""
        body = {
            "member_id": member_id,
            "member_epoch": member_epoch,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition, "offset": offset}
                for tp, offset in sorted(offsets.items())
            ],
        }
        document = await self._request(
            "POST", f"/v1/groups/{_checked_group(group_id)}/offsets/out-of-range-reset", json=body
        )
        return {
            TopicPartition(str(entry["topic"]), int(entry["partition"])): (
                CommittedOffsets.from_json(entry)
            )
            for entry in document["partitions"]
        }

    async def limits(self) -> Limits:
        """What one commit may carry on this coordinator (``GET /v1/limits``); DESIGN's
        defaults from a coordinator too old to say."""
        return await self._limits(retries=None)

    async def wait_until_reachable(self, timeout_s: float) -> Limits:
        """Ask the coordinator until it answers, for at most ``timeout_s``; then
        ``CoordinatorUnavailable`` naming the URL and the last error, so a wrong URL fails
        fast instead of retrying forever. Answers it gives (a bad token) raise at once."""
        last: CoordinatorUnavailable | None = None
        backoff = _BACKOFF_INITIAL_S
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    try:
                        return await self._limits(retries=0)
                    except CoordinatorUnavailable as error:
                        last = error
                        self._warn_retry("GET", "/v1/limits", error)
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, _BACKOFF_MAX_S)
        except TimeoutError:
            raise CoordinatorUnavailable(
                f"no Keyrange coordinator answered at {self._base_url} within {timeout_s:g} s"
                f" ({last or 'no answer'}); check coordinator_url"
            ) from last

    async def _limits(self, *, retries: int | None) -> Limits:
        try:
            document = await self._request("GET", "/v1/limits", retries=retries)
        except KeyrangeClientError as error:
            if error.status != 404:
                raise
            logger.debug("the coordinator has no /v1/limits; assuming the defaults")
            return Limits()
        return Limits(max_ranges_per_request=int(document["max_ranges_per_request"]))

    async def set_accept_range_fetch(self, topic: str, accept: bool = True) -> None:
        """Let the coordinator split ``topic``'s partitions by key among members (its
        ``accept.range.fetch``, docs/design.md §4); needs an admin-scope token."""
        await self._request(
            "PUT",
            f"/v1/admin/topics/{_checked_topic(topic)}/config",
            json={"accept_range_fetch": accept},
        )

    async def group_owners(self, group_id: str) -> GroupOwners:
        """Who owns which key ranges of the group's partitions in the coordinator's view of
        it (nobody, for a group that does not exist); any token that may use the group may
        ask."""
        try:
            document = await self._request("GET", f"/v1/groups/{_checked_group(group_id)}/owners")
        except GroupIdNotFound:
            return GroupOwners(())
        owned = []
        for entry in document.get("owners", []):
            owner = KeyOwner(
                name=str(entry.get("instance_id") or entry["member_id"]),
                member_id=str(entry["member_id"]),
                endpoint=entry.get("endpoint"),
            )
            for start, end in entry["ranges"]:
                owned.append((str(entry["topic"]), int(entry["partition"]), start, end, owner))
        return GroupOwners(tuple(owned))

    async def heartbeat(self, group_id: str, request: HeartbeatRequest) -> HeartbeatReply:
        anonymous_join = (
            request.member_epoch == 0 and request.member_id is None and request.instance_id is None
        )
        document = await self._request(
            "POST",
            f"/v1/groups/{_checked_group(group_id)}/heartbeat",
            json=request.to_json(),
            retries=0 if anonymous_join else self._max_retries,
        )
        return HeartbeatReply.from_json(document)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Sequence[tuple[str, str | int]] = (),
        retries: int | None = None,
    ) -> Any:
        attempts_left = self._max_retries if retries is None else retries
        backoff = _BACKOFF_INITIAL_S
        while True:
            try:
                return await self._request_once(method, path, json=json, params=params)
            except CoordinatorUnavailable as error:
                if attempts_left <= 0:
                    raise
                attempts_left -= 1
                self._warn_retry(method, path, error)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, _BACKOFF_MAX_S)

    def _warn_retry(self, method: str, path: str, error: CoordinatorUnavailable) -> None:
        """A retry at WARNING, at most once per ``_RETRY_WARNING_INTERVAL_S`` (the rest at
        DEBUG), so an unreachable coordinator is visible without flooding the log."""
        now = time.monotonic()
        due = (
            self._retry_warned_at is None
            or now - self._retry_warned_at >= _RETRY_WARNING_INTERVAL_S
        )
        if due:
            self._retry_warned_at = now
        logger.log(
            logging.WARNING if due else logging.DEBUG,
            "coordinator at %s did not answer (%s); retrying",
            self._base_url,
            error,
            extra={"url": self._base_url, "method": method, "path": path, "error": str(error)},
        )

    async def _request_once(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        params: Sequence[tuple[str, str | int]],
    ) -> Any:
        try:
            response = await self._http.request(method, path, json=json, params=list(params))
        except httpx.TransportError as error:
            raise CoordinatorUnavailable(
                f"coordinator unreachable: {type(error).__name__}: {error}"
            ) from error
        if response.is_success:
            return response.json()
        raise _problem_error(response)


def _checked_group(group_id: str) -> str:
    # Validated here so a group id can never change the request path ("..", "/").
    if not _GROUP_ID.fullmatch(group_id) or group_id in {".", ".."}:
        raise InvalidRequest(f"invalid group id {group_id!r}: 1..255 chars of [A-Za-z0-9._-]")
    return group_id


def _checked_topic(topic: str) -> str:
    # Kafka's own rule for topic names, which also keeps the request path intact.
    if not _TOPIC.fullmatch(topic) or topic in {".", ".."}:
        raise InvalidRequest(f"invalid topic {topic!r}: 1..249 chars of [A-Za-z0-9._-]")
    return topic


def _problem_error(response: httpx.Response) -> Exception:
    name: str | None = None
    detail = response.reason_phrase or f"HTTP {response.status_code}"
    extra: dict[str, Any] = {}
    try:
        document = response.json()
    except ValueError:
        document = None
    if isinstance(document, dict):
        raw_name = document.get("error")
        name = raw_name if isinstance(raw_name, str) else None
        detail = str(document.get("detail") or document.get("title") or detail)
        extra = {
            key: value
            for key, value in document.items()
            if key not in {"type", "title", "status", "detail", "error"}
        }
    error_class = error_for_name(name, response.status_code)
    return error_class(detail, status=response.status_code, **extra)
