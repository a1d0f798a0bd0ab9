"""Stateful stream processing (KIP-28's processor API) on Keyrange's key-range tasks.

A task is a partition group (co-partitioned source topics) restricted to one key range, so an
application scales past the partition count; each task's stores are restored from their
changelogs filtered by the task's key range. See docs/streams.md.
"""

from __future__ import annotations

from client.streams.app import StreamsApp
from client.streams.config import StreamsConfig
from client.streams.errors import (
    ProcessorFailed,
    SendFailed,
    StoreKeyOutsideTask,
    StreamsError,
    TopologyError,
    UnknownStore,
)
from client.streams.processor import (
    STREAM_TIME,
    WALL_CLOCK,
    KeyValueStore,
    Processor,
    ProcessorContext,
    PunctuationType,
)
from client.streams.queries import QueryAnswer
from client.streams.serde import BYTES, INT64, JSON, STRING, Serde
from client.streams.topology import BuiltTopology, StoreSpec, Topology

__all__ = [
    "BYTES",
    "INT64",
    "JSON",
    "STREAM_TIME",
    "STRING",
    "WALL_CLOCK",
    "BuiltTopology",
    "KeyValueStore",
    "Processor",
    "ProcessorContext",
    "ProcessorFailed",
    "PunctuationType",
    "QueryAnswer",
    "SendFailed",
    "Serde",
    "StoreKeyOutsideTask",
    "StoreSpec",
    "StreamsApp",
    "StreamsConfig",
    "StreamsError",
    "Topology",
    "TopologyError",
    "UnknownStore",
]
