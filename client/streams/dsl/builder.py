"""``StreamsBuilder``: where a DSL application starts (streams and tables from topics) and
what compiles it onto a processor-API ``Topology``.

Every step adds its nodes to the topology at once, named ``<operation>-<n>`` in call order
(or by ``name=``), and remembers the line of user code that called it: a ``TopologyError``
raised by a step, or by ``build()`` about a node, names the step and that line, and a
processor failing at run time names its node, which ``describe()`` maps back to the line.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass

from client.streams.dsl.api import Stream, Table
from client.streams.dsl.processors import TableSource
from client.streams.errors import TopologyError
from client.streams.serde import BYTES, Serde
from client.streams.topology import StoreSpec, TimestampExtractor, Topology, record_timestamp

_HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Step:
    """One DSL call: its operation, the node it made and where the user called it."""

    operation: str
    node: str
    where: str

    def __str__(self) -> str:
        return f"{self.operation} '{self.node}' ({self.where})"


def _caller() -> str:
    """The first frame outside this package: the user's line that called the step."""
    frame = inspect.currentframe()
    while frame is not None and (
        os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE
        or frame.f_code.co_filename == contextlib.__file__
    ):
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{os.path.relpath(frame.f_code.co_filename)}:{frame.f_lineno}"


class StreamsBuilder:
    """Builds a topology from DSL steps; ``build()`` returns it for ``StreamsApp`` or for
    ``keyrange streams module:function``."""

    def __init__(self) -> None:
        self.topology = Topology()
        self.steps: list[Step] = []
        self._count = 0

    # ------------------------------------------------------------ entry points

    def stream(
        self,
        *topics: str,
        key_serde: Serde = BYTES,
        value_serde: Serde = BYTES,
        timestamp_extractor: TimestampExtractor = record_timestamp,
        name: str | None = None,
    ) -> Stream:
        """The records of ``topics`` (co-partitioned with whatever they are joined to)."""
        with self.step("stream", name) as node:
            self.topology.add_source(
                node,
                *topics,
                key_serde=key_serde,
                value_serde=value_serde,
                timestamp_extractor=timestamp_extractor,
            )
        return Stream(self, node, key_serde, value_serde)

    def table(
        self,
        topic: str,
        *,
        key_serde: Serde = BYTES,
        value_serde: Serde = BYTES,
        store: str | None = None,
        persistent: bool = True,
        name: str | None = None,
    ) -> Table:
        """The latest value per key of a compacted topic, in a store whose changelog is the
        topic itself (nothing else is written; a new owner of a key range restores it from
        the topic). ``key_serde`` must give back the topic's key bytes (STRING, BYTES and
        INT64 do), as the restore reads them raw."""
        with self.step("table", name) as node:
            source = f"{node}-source"
            store_name = store or f"{node}-store"
            self.topology.add_source(source, topic, key_serde=key_serde, value_serde=value_serde)
            self.topology.add_processor(node, lambda: TableSource(store_name), source)
            self.topology.add_state_store(
                StoreSpec(
                    store_name, key_serde, value_serde, persistent=persistent, source_topic=topic
                ),
                node,
            )
        return Table(self, node, store_name, key_serde, value_serde)

    def build(self) -> Topology:
        """The topology, checked (``Topology.build``) with any error naming its step."""
        try:
            self.topology.build()
        except TopologyError as error:
            raise TopologyError(self._attributed(str(error))) from error
        return self.topology

    def describe(self) -> str:
        """One line per step: node, operation and the line of code that made it."""
        return "\n".join(
            f"{step.node:<24} {step.operation:<16} {step.where}" for step in self.steps
        )

    # ------------------------------------------------------------ for the steps

    @contextlib.contextmanager
    def step(self, operation: str, name: str | None) -> Iterator[str]:
        """Name a step's node and attribute any ``TopologyError`` it raises to the step."""
        self._count += 1
        node = name or f"{operation.replace('_', '-')}-{self._count}"
        step = Step(operation, node, _caller())
        try:
            yield node
        except TopologyError as error:
            raise TopologyError(f"{step}: {error}") from error
        self.steps.append(step)

    def fail(self, operation: str, message: str) -> TopologyError:
        """An error about a step refused before it made a node."""
        return TopologyError(f"{operation} ({_caller()}): {message}")

    def _attributed(self, message: str) -> str:
        for step in reversed(self.steps):
            if f"'{step.node}" in message:
                return f"{step}: {message}"
        return message
