"""Serdes: how a source reads keys and values and how a sink or a store writes them.

A serde is any object with ``serialize(value) -> bytes | None`` and
``deserialize(data: bytes | None) -> value``; ``None`` passes through both ways, so a
tombstone stays a tombstone.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Serde(Protocol):
    def serialize(self, value: Any) -> bytes | None: ...

    def deserialize(self, data: bytes | None) -> Any: ...


class BytesSerde:
    def serialize(self, value: Any) -> bytes | None:
        return None if value is None else bytes(value)

    def deserialize(self, data: bytes | None) -> Any:
        return data


class StringSerde:
    def serialize(self, value: Any) -> bytes | None:
        return None if value is None else str(value).encode()

    def deserialize(self, data: bytes | None) -> Any:
        return None if data is None else data.decode()


class JsonSerde:
    """Compact, key-sorted JSON, so equal values serialize to equal bytes (a store key's
    bytes are what its hash and its range scans see)."""

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()

    def deserialize(self, data: bytes | None) -> Any:
        return None if data is None else json.loads(data)


class Int64Serde:
    """Big-endian signed 8 bytes, Kafka's ``LongSerializer``; byte order is numeric order
    for non-negative values, so range scans over counts or times sort as numbers."""

    def serialize(self, value: Any) -> bytes | None:
        return None if value is None else int(value).to_bytes(8, "big", signed=True)

    def deserialize(self, data: bytes | None) -> Any:
        return None if data is None else int.from_bytes(data, "big", signed=True)


BYTES = BytesSerde()
STRING = StringSerde()
JSON = JsonSerde()
INT64 = Int64Serde()
