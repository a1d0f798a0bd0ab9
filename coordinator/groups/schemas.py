"""Wire shapes of the heartbeat route and the membership admin routes (docs/api.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from fnmatch import fnmatchcase
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from client.protocol.epochs import JOIN_EPOCH
from coordinator.core.topic_pattern import compile_topic_pattern
from coordinator.errors import EndpointNotAllowed
from coordinator.validation import (
    INT32_MAX,
    STORABLE,
    ClientId,
    KeyHash,
    Label,
    MemberEpoch,
    MemberId,
    Offset,
    PartitionId,
    TopicName,
)

# Generous bounds that still keep one heartbeat body small and its handling cheap.
MAX_SUBSCRIBED_TOPICS = 10_000
MAX_OWNED_SLICES = 100_000
MAX_RANGES_PER_SLICE = 10_000
MAX_REGEX_CHARS = 1_000
# A member reports one entry per key its threads cannot stop: a handful, even on a bad day.
MAX_STUCK_CALLS = 1_000
MAX_ENDPOINT_CHARS = 1_000
# A streams instance keeps standbys of about num_standby_replicas times its own share.
MAX_STANDBY_SLICES = MAX_OWNED_SLICES

# Where a member serves queries, e.g. a streams instance's ``http://10.0.0.5:7070``: an HTTP
# base URL (scheme and host, an optional path), never anything a browser would run.
Endpoint = Annotated[
    str,
    StringConstraints(max_length=MAX_ENDPOINT_CHARS, pattern=r"^https?://[^\s/?#@]+(/[^\s?#]*)?$"),
    STORABLE,
]

KeyRangeJson = tuple[KeyHash, KeyHash]


def check_endpoint(endpoint: str | None, allowed_hosts: Sequence[str]) -> None:
    """Refuse an endpoint on a host the operator's ``allowed_endpoint_hosts`` does not name
    (none: any host). Streams instances send queries to the endpoints members advertise, so
    without the list a member of a group could point its peers at any address they reach
    (docs/security.md, "Queries over HTTP"). A CIDR matches only a literal address: names
    are not resolved here, as their answer may change by the time a peer connects."""
    if endpoint is None or not allowed_hosts:
        return
    host = (urlsplit(endpoint).hostname or "").lower()
    try:
        address: IPv4Address | IPv6Address | None = ip_address(host)
    except ValueError:
        address = None
    for pattern in allowed_hosts:
        if "/" in pattern:
            if address is not None and address in ip_network(pattern, strict=False):
                return
        elif fnmatchcase(host, pattern):
            return
    raise EndpointNotAllowed(
        f"endpoint host {host!r} is not in the coordinator's allowed_endpoint_hosts",
        endpoint=endpoint,
    )


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SliceJson(StrictModel):
    topic: TopicName
    partition: PartitionId
    ranges: Annotated[list[KeyRangeJson], Field(min_length=1, max_length=MAX_RANGES_PER_SLICE)]

    @model_validator(mode="after")
    def _ordered_ranges(self) -> SliceJson:
        for start, end in self.ranges:
            if start > end:
                raise ValueError(f"key range [{start}, {end}] has start > end")
        return self


class StuckCallJson(StrictModel):
    """A call of the member's user code still running on a key of a slice it was asked to
    give up: it holds that key, and the slice, until it ends (docs/design.md §5, "Release means
    nothing of it runs")."""

    topic: TopicName
    partition: PartitionId
    key_hash: KeyHash
    offset: Offset
    # Seconds the call has been running when the member sent the heartbeat.
    running_s: Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]


class HeartbeatRequest(StrictModel):
    member_id: MemberId | None = None
    member_epoch: MemberEpoch
    instance_id: Label | None = None
    client_id: ClientId | None = None
    subscribed_topics: (
        Annotated[list[TopicName], Field(max_length=MAX_SUBSCRIBED_TOPICS)] | None
    ) = None
    subscribed_topic_regex: (
        Annotated[str, StringConstraints(max_length=MAX_REGEX_CHARS), STORABLE] | None
    ) = None
    assignor: Label | None = None
    allow_individual_commit: bool | None = None
    session_timeout_ms: Annotated[int, Field(ge=1, le=INT32_MAX, strict=True)] | None = None
    owned: Annotated[list[SliceJson], Field(max_length=MAX_OWNED_SLICES)] | None = None
    # How long the member is willing to wait for a change before the reply (prompt
    # hand-offs, docs/api.md); the coordinator waits at most the member's heartbeat interval.
    wait_ms: Annotated[int, Field(ge=0, le=INT32_MAX, strict=True)] | None = None
    # The member's stuck calls now: None leaves what it last reported, [] clears it.
    stuck: Annotated[list[StuckCallJson], Field(max_length=MAX_STUCK_CALLS)] | None = None
    # Where the member serves queries (docs/api.md, "Member endpoints"): None leaves what it
    # last advertised; a member sends it when it joins.
    endpoint: Endpoint | None = None
    # The key ranges the member keeps warm standbys of (docs/api.md, "Standby key ranges"):
    # None leaves what it last reported, [] clears it.
    standbys: Annotated[list[SliceJson], Field(max_length=MAX_STANDBY_SLICES)] | None = None

    @field_validator("subscribed_topic_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            compile_topic_pattern(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> HeartbeatRequest:
        if self.member_epoch != JOIN_EPOCH and self.member_id is None:
            raise ValueError("member_id is required unless joining (member_epoch 0)")
        if (
            self.member_epoch == JOIN_EPOCH
            and self.subscribed_topics is None
            and self.subscribed_topic_regex is None
        ):
            raise ValueError("a join needs subscribed_topics or subscribed_topic_regex")
        for name, entries in (("owned", self.owned), ("standbys", self.standbys)):
            seen: set[tuple[str, int]] = set()
            for entry in entries or ():
                key = (entry.topic, entry.partition)
                if key in seen:
                    raise ValueError(f"{name} lists {entry.topic}-{entry.partition} twice")
                seen.add(key)
        return self


class IdleReply(BaseModel):
    """Why the member was given nothing, when a switch is the cause (docs/api.md)."""

    switch: str
    topics: list[str]
    message: str


class HeartbeatReply(BaseModel):
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    session_timeout_ms: int
    assignment: list[SliceJson]
    # Send the next heartbeat at once: the reply waited out the interval, or something
    # changed for the member while it waited.
    heartbeat_now: bool = False
    idle: IdleReply | None = None


class StuckCallDescription(BaseModel):
    """A stuck call as its member last reported it, aged to the moment of the description
    (docs/api.md, "Stuck calls")."""

    topic: str
    partition: int
    key_hash: int
    offset: int
    # As reported; ``running_for_s`` adds the report's age: the member keeps a call in its
    # list until it ends, so a live member's report still holds.
    running_s: float
    reported_at: datetime
    report_age_s: float
    running_for_s: float
    summary: str


class MemberDescription(BaseModel):
    member_id: str
    instance_id: str | None
    client_id: str | None
    client_host: str | None
    joined_at: datetime
    last_heartbeat: datetime
    expires_at: datetime
    member_epoch: int
    subscribed_topics: list[str]
    subscribed_topic_regex: str | None
    assignor: str | None
    allow_individual_commit: bool
    session_timeout_ms: int
    owned: list[SliceJson]
    assigned: list[SliceJson]
    target: list[SliceJson]
    stuck: list[StuckCallDescription] = Field(default_factory=list)
    endpoint: str | None = None
    standbys: list[SliceJson] = Field(default_factory=list)


class GroupDescription(BaseModel):
    group_id: str
    state: str
    assignor: str | None
    group_epoch: int
    rebalance_requested: bool
    rebalance_reason: str | None
    members: list[MemberDescription]


class OwnedRanges(BaseModel):
    """Key ranges of one partition that one live member owns now."""

    topic: str
    partition: int
    ranges: list[KeyRangeJson]
    member_id: str
    instance_id: str | None
    endpoint: str | None


class GroupOwnersReply(BaseModel):
    """Who owns what in a group: what a member needs to route a query to a key's owner
    (docs/api.md, "Key owners"), and nothing else of its group-mates."""

    group_id: str
    group_epoch: int
    owners: list[OwnedRanges]


class RebalanceReply(BaseModel):
    group_id: str
    group_epoch: int


class RemovedMemberReply(BaseModel):
    group_id: str
    member_id: str
    group_epoch: int
