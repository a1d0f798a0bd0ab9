"""Many clients committing interleaved ranges to one partition at once never lose a range."""

from __future__ import annotations

import asyncio
import random

import httpx


async def test_concurrent_interleaved_commits_equal_their_union(api: httpx.AsyncClient) -> None:
    offsets = list(range(2_000))
    random.Random(7).shuffle(offsets)
    workers = 32
    slices = [offsets[i::workers] for i in range(workers)]

    async def committer(mine: list[int]) -> None:
        for start in range(0, len(mine), 5):
            batch = sorted(mine[start : start + 5])
            body = {
                "partitions": [
                    {"topic": "hot", "partition": 0, "ranges": [[o, o] for o in batch]},
                    {"topic": "hot", "partition": 1, "ranges": [[o, o] for o in batch]},
                ]
            }
            reply = await api.post("/v1/groups/concurrent/offsets/commit", json=body)
            assert reply.status_code == 200, reply.text

    await asyncio.gather(*(committer(mine) for mine in slices))
    reply = await api.get("/v1/groups/concurrent/offsets")
    partitions = reply.json()["partitions"]
    assert [(p["partition"], p["stable_offset"], p["ranges"]) for p in partitions] == [
        (0, 2_000, []),
        (1, 2_000, []),
    ]
