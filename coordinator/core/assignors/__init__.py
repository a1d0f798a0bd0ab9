"""The group assignors by the name a member asks for (docs/api.md ``assignor``)."""

from __future__ import annotations

from coordinator.core.assignors.base import Assignor
from coordinator.core.assignors.range import RangeAssignor
from coordinator.core.assignors.round_robin import RoundRobinAssignor
from coordinator.core.assignors.sticky_join import StickyJoinAssignor

DEFAULT_ASSIGNOR = "round-robin"

ASSIGNORS: dict[str, Assignor] = {
    assignor.name: assignor
    for assignor in (RoundRobinAssignor(), RangeAssignor(), StickyJoinAssignor())
}


class UnknownAssignorError(KeyError):
    """A group or member asked for an assignor this coordinator does not have."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown assignor '{self.name}'; known: {', '.join(sorted(ASSIGNORS))}"


def get_assignor(name: str | None = None) -> Assignor:
    """The assignor called ``name``, or the default (``round-robin``) when none is named."""
    try:
        return ASSIGNORS[name or DEFAULT_ASSIGNOR]
    except KeyError:
        raise UnknownAssignorError(name or DEFAULT_ASSIGNOR) from None


__all__ = [
    "ASSIGNORS",
    "DEFAULT_ASSIGNOR",
    "Assignor",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyJoinAssignor",
    "UnknownAssignorError",
    "get_assignor",
]
