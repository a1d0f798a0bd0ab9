"""The runtime's commit on its own, without a broker: what a coordinator that cannot take a
commit does to the instance (issue 27, item 6). Before, every error but ``ConsumerStopped``
left the processing loop and stopped the instance; ``UnknownMemberId`` did so in the window
between a lost membership and the heartbeat's handling of it."""

from __future__ import annotations

from typing import Any, cast

import pytest

from client import errors
from client.streams import INT64, STRING, StoreSpec, Topology
from client.streams.restore import Restorer
from client.streams.runtime import StreamsRuntime
from client.streams.state import StateManager
from tests.client.in_memory_source import InMemorySource
from tests.streams.harness import Count
from tests.waiting import until


class Producer:
    """Nothing to send: the commit's flush has nothing to wait for."""

    async def flush(self) -> None:
        return None


def runtime(commit: Any) -> StreamsRuntime:
    topology = (
        Topology()
        .add_source("words", "words", key_serde=STRING, value_serde=INT64)
        .add_processor("count", Count, "words")
        .add_state_store(StoreSpec("counts", STRING, INT64), "count")
        .build()
    )
    return StreamsRuntime(
        cast(Any, InMemorySource()),
        topology=topology,
        application_id="app",
        producer=cast(Any, Producer()),
        restorer=cast(Restorer, None),
        state=StateManager(topology, None),
        owned=list,
        commit=commit,
        commit_interval_s=60,
        max_idle_ms=0,
        max_buffered_bytes=1 << 20,
        processing_threads=1,
        on_restore=lambda _: None,
    )


@pytest.mark.parametrize(
    "error",
    [
        errors.CoordinatorUnavailable("coordinator unreachable: ConnectError"),
        errors.UnknownMemberId("the session was lost; nothing committed"),
        errors.FencedMemberEpoch("stale epoch"),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_a_commit_the_coordinator_cannot_take_is_tried_again_soon(
    error: errors.KeyrangeClientError,
) -> None:
    attempts: list[float] = []

    async def commit() -> None:
        attempts.append(0)
        if len(attempts) == 1:
            raise error

    streams = runtime(commit)
    await streams.commit()
    # Not raised: the processing loop goes on. The next attempt comes after the backoff
    # (0.1 s), not after the 60 s interval.
    await until(streams._commits.schedule.due, 2, "the commit's retry")
    await streams.commit()
    assert len(attempts) == 2
    assert not streams._commits.schedule.due()


async def test_an_error_retrying_cannot_help_stops_the_instance() -> None:
    async def commit() -> None:
        raise errors.Forbidden("the token may not commit for this group")

    with pytest.raises(errors.Forbidden):
        await runtime(commit).commit()
