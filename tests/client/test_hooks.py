"""The lifecycle hooks' fan-out (client/runtime/hooks.py): one fixed order, parts before the
user's listener, and which failures stop the event and which do not."""

from __future__ import annotations

import logging

import pytest
from aiokafka.structs import TopicPartition

from client.consumer import RebalanceListener
from client.http import Slices
from client.protocol.keyspace import KeyRange
from client.runtime.hooks import Hooks, LifecycleHooks

SLICES: Slices = {TopicPartition("orders", 0): [KeyRange.full()]}


class Part(LifecycleHooks):
    def __init__(self, name: str, heard: list[str], *, fails: str | None = None) -> None:
        self._name = name
        self._heard = heard
        self._fails = fails

    def _hear(self, hook: str) -> None:
        self._heard.append(f"{self._name}.{hook}")
        if hook == self._fails:
            raise RuntimeError(f"{self._name} failed in {hook}")

    def assigned(self, slices: Slices) -> None:
        self._hear("assigned")

    def revoking(self, slices: Slices) -> None:
        self._hear("revoking")

    async def stop_calls(self, slices: Slices) -> None:
        self._hear("stop_calls")

    async def revoked(self, slices: Slices) -> None:
        self._hear("revoked")

    def lost(self, slices: Slices) -> None:
        self._hear("lost")

    async def dropped(self, slices: Slices) -> None:
        self._hear("dropped")

    async def stopping(self, timeout_s: float | None) -> None:
        self._hear("stopping")


class Listener(RebalanceListener):
    def __init__(self, heard: list[str]) -> None:
        self._heard = heard

    async def on_slices_assigned(self, slices: Slices) -> None:
        self._heard.append("user.on_slices_assigned")

    async def on_slices_revoked(self, slices: Slices) -> None:
        self._heard.append("user.on_slices_revoked")

    async def on_slices_lost(self, slices: Slices) -> None:
        self._heard.append("user.on_slices_lost")


async def test_every_hook_reaches_the_parts_in_registration_order_then_the_user() -> None:
    heard: list[str] = []
    hooks = Hooks("g", Listener(heard))
    for name in ("buffer", "runtime"):
        hooks.register(Part(name, heard))
    await hooks.assigned(SLICES)
    hooks.revoking(SLICES)
    await hooks.stop_calls(SLICES)
    await hooks.revoked(SLICES)
    hooks.lost(SLICES)
    await hooks.dropped(SLICES)
    await hooks.stopping(1.0)
    assert heard == [
        "buffer.assigned",
        "runtime.assigned",
        "user.on_slices_assigned",
        "buffer.revoking",
        "runtime.revoking",
        "buffer.stop_calls",
        "runtime.stop_calls",
        "buffer.revoked",
        "runtime.revoked",
        "user.on_slices_revoked",
        "buffer.lost",
        "runtime.lost",
        "buffer.dropped",
        "runtime.dropped",
        "user.on_slices_lost",
        "buffer.stopping",
        "runtime.stopping",
    ]


async def test_an_unregistered_part_hears_nothing_more_and_a_part_registers_once() -> None:
    heard: list[str] = []
    hooks = Hooks("g", RebalanceListener())
    runtime = Part("runtime", heard)
    hooks.register(runtime)
    hooks.register(runtime)
    hooks.revoking(SLICES)
    hooks.unregister(runtime)
    hooks.revoking(SLICES)
    assert heard == ["runtime.revoking"]


async def test_a_part_failing_to_follow_a_change_is_logged_and_the_rest_still_hear_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[str] = []
    hooks = Hooks("g", Listener(heard))
    hooks.register(Part("streams", heard, fails="revoked"))
    hooks.register(Part("other", heard))
    caplog.set_level(logging.ERROR, logger="client.runtime.hooks")
    await hooks.revoked(SLICES)
    assert heard == ["streams.revoked", "other.revoked", "user.on_slices_revoked"]
    assert [record.getMessage() for record in caplog.records] == [
        "a part failed to follow an ownership change"
    ]


async def test_a_failure_in_a_safety_step_is_raised_to_the_caller() -> None:
    heard: list[str] = []
    hooks = Hooks("g", RebalanceListener())
    hooks.register(Part("runtime", heard, fails="lost"))
    with pytest.raises(RuntimeError, match="failed in lost"):
        hooks.lost(SLICES)
