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


def _storable(text: str) -> str:
    """Refuse what Postgres cannot hold in ``text``: the NUL character, and (from a JSON
    escape such as ``\\ud800``) a UTF-16 surrogate without its pair, which has no UTF-8
    form. Caught here, at validation, such text is a 400 naming its field, not a 500 from
    the database halfway through a request."""
    if "\x00" in text:
        raise ValueError("text cannot contain the NUL character (\\u0000)")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text cannot contain an unpaired UTF-16 surrogate") from None
    return text


# Every free-text field of a request carries it; ids and names with a pattern need not.
STORABLE = AfterValidator(_storable)

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
MemberId = Annotated[str, StringConstraints(min_length=1, max_length=255), STORABLE]
# Short labels a member gives itself: instance id, assignor name.
Label = Annotated[str, StringConstraints(min_length=1, max_length=255), STORABLE]
ClientId = Annotated[str, StringConstraints(max_length=255), STORABLE]
MemberEpoch = Annotated[int, Field(ge=-1, le=INT32_MAX, strict=True)]
