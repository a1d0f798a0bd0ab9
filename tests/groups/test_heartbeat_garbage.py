"""Membership changes leave no reference cycles behind.

Only the collector frees a cycle, and its pauses stop the whole event loop: at 10,000
waiting members, statements built per heartbeat (SQLAlchemy expressions are cyclic) fed
collections of 150-440 ms during joins, which held every group's hand-offs and replies
(bench/history/2026-11-26-issue-29-part-3-round-4.md). The statements are now built
once; this looks at what joins, hand-offs and leaves leave for the collector.
"""

from __future__ import annotations

import gc
from collections import Counter

import httpx
from fastapi import FastAPI

from tests.groups.test_heartbeat_api import Member, given_topics

ROUNDS = 10
# What a coordinator serving heartbeats runs; whatever type of theirs is in a cycle the
# collector had to find.
SERVING_LIBRARIES = {"coordinator", "sqlalchemy", "asyncpg", "starlette", "fastapi", "pydantic"}


async def test_joins_hand_offs_and_leaves_leave_no_cycles_for_the_collector(
    coordinator_app: FastAPI, api: httpx.AsyncClient
) -> None:
    await given_topics(coordinator_app, churned=4)
    stayer = Member(api, "churn")
    await stayer.join(["churned"])
    # Warm up: compiled statements, pools and lazily built objects are made once.
    visitor = Member(api, "churn")
    await visitor.join(["churned"])
    await stayer.heartbeat()
    await visitor.leave()
    await stayer.heartbeat()

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(ROUNDS):
            visitor = Member(api, "churn")
            await visitor.join(["churned"])
            await stayer.heartbeat()
            await visitor.heartbeat()
            await visitor.leave()
            await stayer.heartbeat()
        gc.collect()
        left = Counter(
            f"{type(thing).__module__}.{type(thing).__qualname__}"
            for thing in gc.garbage
            if type(thing).__module__.split(".")[0] in SERVING_LIBRARIES
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    # Before the statements were built once, each locked heartbeat left about 40 objects
    # in cycles, SQLAlchemy expressions among them. (The test's HTTP client leaves some of
    # its own, which a coordinator does not run.)
    assert left == Counter()
