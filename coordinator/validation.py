"""Identifier and number rules shared by every route, matching Kafka's own limits so that
anything the coordinator accepts is something Kafka could hold."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

from client.protocol.committed import OFFSET_MAX
from client.protocol.keyspace import HASH_MAX

INT32_MAX = 2**31 - 1


def _not_dot_names(topic: str) -> str:
    if topic in {".", ".."}:
        raise ValueError("topic name cannot be '.' or '..'")
    return topic


GroupId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,255}$")]
TopicName = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$"),
    AfterValidator(_not_dot_names),
]
PartitionId = Annotated[int, Field(ge=0, le=INT32_MAX, strict=True)]
# Query strings carry text, so numbers there are parsed rather than required to be JSON ints.
PartitionQuery = Annotated[int, Field(ge=0, le=INT32_MAX)]
Offset = Annotated[int, Field(ge=0, le=OFFSET_MAX, strict=True)]
KeyHash = Annotated[int, Field(ge=0, le=HASH_MAX, strict=True)]
MemberEpoch = Annotated[int, Field(ge=-1, le=INT32_MAX, strict=True)]
