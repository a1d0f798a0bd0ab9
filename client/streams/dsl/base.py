"""What the DSL's steps share: the builder as they see it and the aggregations' helpers."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from client.streams.errors import TopologyError
from client.streams.topology import Topology


class Builder(Protocol):
    topology: Topology

    def step(self, operation: str, name: str | None) -> AbstractContextManager[str]: ...

    def fail(self, operation: str, message: str) -> TopologyError: ...


class _First:
    """The aggregate of ``reduce`` before a key's first value (never stored)."""


FIRST = _First()


def reducing(reducer: Callable[[Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
    def add(key: Any, value: Any, aggregate: Any) -> Any:
        return value if aggregate is FIRST else reducer(aggregate, value)

    return add


def counted(key: Any, value: Any, count: int) -> int:
    return count + 1


def summed(key: Any, left: int, right: int) -> int:
    return left + right


def checked(builder: Builder, operation: str, **functions: object) -> None:
    for what, function in functions.items():
        if not callable(function):
            raise builder.fail(operation, f"{what} is not callable: {function!r}")
