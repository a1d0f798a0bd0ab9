"""The commit and offset-fetch routes over a real migrated Postgres (docs/design.md §3, §3a)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator.app import create_app
from coordinator.core.offsets import CommitOutcome
from coordinator.offsets.schemas import CommitReply
from coordinator.offsets.service import CommitResult
from tests.fixtures.coordinator import MakeDatabase, insert_live_member, settings_for_tests

HALF = 2**62
FULL_END = 2**63 - 1


async def commit(
    api: httpx.AsyncClient, group: str, *entries: dict[str, Any], **body: Any
) -> httpx.Response:
    return await api.post(
        f"/v1/groups/{group}/offsets/commit", json={"partitions": list(entries), **body}
    )


async def stored(api: httpx.AsyncClient, group: str) -> dict[tuple[str, int], dict[str, Any]]:
    reply = await api.get(f"/v1/groups/{group}/offsets")
    assert reply.status_code == 200, reply.text
    return {(p["topic"], p["partition"]): p for p in reply.json()["partitions"]}


async def test_design_example_ranges_merge_and_stable_offset_advances(
    api: httpx.AsyncClient,
) -> None:
    reply = await commit(
        api, "design", {"topic": "orders", "partition": 0, "ranges": [[43, 45], [48, 49]]}
    )
    assert reply.status_code == 200
    assert reply.json()["partitions"] == [
        {"topic": "orders", "partition": 0, "error": None, "last_stable_offset": 0}
    ]
    # Processing 0..42 and 46..47 closes every gap up to 49.
    reply = await commit(
        api, "design", {"topic": "orders", "partition": 0, "ranges": [[0, 42], [46, 47]]}
    )
    assert reply.json()["partitions"][0]["last_stable_offset"] == 50
    state = (await stored(api, "design"))[("orders", 0)]
    assert state == {
        "topic": "orders",
        "partition": 0,
        "stable_offset": 50,
        "ranges": [],
        "watermarks": [],
        "metadata": None,
    }


async def test_adjacent_and_overlapping_ranges_are_stored_merged(api: httpx.AsyncClient) -> None:
    await commit(api, "merge", {"topic": "t", "partition": 0, "ranges": [[10, 12], [20, 25]]})
    await commit(api, "merge", {"topic": "t", "partition": 0, "ranges": [[13, 14], [24, 30]]})
    assert (await stored(api, "merge"))[("t", 0)]["ranges"] == [[10, 14], [20, 30]]


async def test_range_below_stable_offset_is_too_old_and_reports_it(api: httpx.AsyncClient) -> None:
    await commit(api, "old", {"topic": "t", "partition": 0, "offset": 100})
    reply = await commit(api, "old", {"topic": "t", "partition": 0, "ranges": [[10, 20]]})
    assert reply.status_code == 200
    assert reply.json()["partitions"][0] == {
        "topic": "t",
        "partition": 0,
        "error": "INDIVIDUAL_COMMIT_TOO_OLD",
        "last_stable_offset": 100,
    }


async def test_duplicate_above_stable_offset_is_accepted_silently(api: httpx.AsyncClient) -> None:
    body = {"topic": "t", "partition": 0, "ranges": [[5, 9]]}
    first = await commit(api, "dup", body)
    second = await commit(api, "dup", body)
    assert first.json() == second.json()
    assert second.json()["partitions"][0]["error"] is None
    assert (await stored(api, "dup"))[("t", 0)]["ranges"] == [[5, 9]]


async def test_classic_commit_never_moves_the_stable_offset_backwards(
    api: httpx.AsyncClient,
) -> None:
    await commit(api, "classic", {"topic": "t", "partition": 0, "ranges": [[60, 70]]})
    reply = await commit(
        api, "classic", {"topic": "t", "partition": 0, "offset": 50, "metadata": "m1"}
    )
    assert reply.json()["partitions"][0]["last_stable_offset"] == 50
    reply = await commit(api, "classic", {"topic": "t", "partition": 0, "offset": 20})
    assert reply.json()["partitions"][0]["last_stable_offset"] == 50
    state = (await stored(api, "classic"))[("t", 0)]
    assert state["ranges"] == [[60, 70]]
    assert state["metadata"] == "m1"


async def test_watermarks_covering_the_hash_space_advance_the_stable_offset(
    api: httpx.AsyncClient,
) -> None:
    lower = {"topic": "t", "partition": 0, "watermarks": [[0, HALF - 1, 30]]}
    reply = await commit(api, "wm", lower)
    assert reply.json()["partitions"][0]["last_stable_offset"] == 0
    upper = {
        "topic": "t",
        "partition": 0,
        "watermarks": [[HALF, FULL_END, 20]],
        "ranges": [[20, 24]],
    }
    reply = await commit(api, "wm", upper)
    # min W is 20, and 20..24 are processed individually: the stable offset reaches 25.
    assert reply.json()["partitions"][0]["last_stable_offset"] == 25
    state = (await stored(api, "wm"))[("t", 0)]
    assert state["watermarks"] == [[0, HALF - 1, 30]]
    assert state["ranges"] == []


async def test_commit_is_all_or_nothing_on_bad_input(api: httpx.AsyncClient) -> None:
    await commit(api, "atomic", {"topic": "t", "partition": 0, "ranges": [[1, 2]]})
    before = await stored(api, "atomic")
    for bad in (
        [
            {"topic": "t", "partition": 0, "ranges": [[5, 6]]},
            {"topic": "t", "partition": 1, "ranges": [[9, 3]]},
        ],
        [
            {"topic": "t", "partition": 0, "ranges": [[5, 6]]},
            {"topic": "bad topic", "partition": 1, "offset": 1},
        ],
        [
            {"topic": "t", "partition": 0, "ranges": [[5, 6]]},
            {"topic": "t", "partition": -1, "offset": 1},
        ],
        [{"topic": "t", "partition": 0, "ranges": [[5, 2**63]]}],
        [{"topic": "t", "partition": 0, "ranges": [[5, 2**63 - 1]]}],
        [{"topic": "t", "partition": 0, "ranges": [[5, 6]], "offset": 7}],
        [{"topic": "t", "partition": 0}],
        [
            {"topic": "t", "partition": 0, "ranges": [[5, 6]]},
            {"topic": "t", "partition": 0, "offset": 1},
        ],
        [{"topic": "t", "partition": 0, "watermarks": [[7, 3, 10]]}],
    ):
        reply = await api.post("/v1/groups/atomic/offsets/commit", json={"partitions": bad})
        assert reply.status_code == 400, reply.text
        assert reply.headers["content-type"] == "application/problem+json"
        assert reply.json()["error"] == "INVALID_REQUEST"
    assert await stored(api, "atomic") == before


async def test_replies_are_the_bytes_their_declared_model_writes(api: httpx.AsyncClient) -> None:
    """The route writes a reply from fragments, not through ``CommitReply``."""
    first = await commit(
        api,
        "reply-bytes",
        {"topic": "t.a_b-1", "partition": 0, "ranges": [[5, 9]]},
        {"topic": "t", "partition": 3, "offset": 4},
    )
    too_old = await commit(api, "reply-bytes", {"topic": "t", "partition": 3, "ranges": [[1, 2]]})
    assert too_old.json()["partitions"][0]["error"] == "INDIVIDUAL_COMMIT_TOO_OLD"
    for reply in (first, too_old):
        assert reply.status_code == 200, reply.text
        written = CommitReply.model_validate_json(reply.content).model_dump_json().encode()
        assert reply.content == written
    every_outcome = CommitResult(
        tuple(
            ("t", number, outcome.error_name, 2**63 - 1 - number)
            for number, outcome in enumerate(CommitOutcome)
        ),
        rebalance_needed=True,
    )
    assert every_outcome.body() == every_outcome.reply.model_dump_json().encode()


async def test_bodies_that_are_not_json_objects_are_refused_with_their_location(
    api: httpx.AsyncClient,
) -> None:
    url = "/v1/groups/shapes/offsets/commit"
    entry = b'{"partitions": [{"topic": "t", "partition": 0, "offset": 1}]}'
    for content, content_type, location in (
        (b'{"partitions": [', "application/json", "body"),
        (b"[]", "application/json", "body"),
        (entry, "text/plain", "body"),
        (entry, None, "body"),
        (b'{"partitions": [{"topic": "t", "partition": "x", "offset": 1}]}', None, "body"),
        (
            b'{"partitions": [{"topic": "t", "partition": "x", "offset": 1}]}',
            "application/json",
            "body.partitions.0.partition",
        ),
    ):
        headers = {} if content_type is None else {"content-type": content_type}
        reply = await api.post(url, content=content, headers=headers)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"] == "INVALID_REQUEST"
        assert reply.json()["errors"][0]["loc"] == location, reply.text
    reply = await api.post(url, content=entry, headers={"content-type": "application/json"})
    assert reply.status_code == 200, reply.text


async def test_bad_group_ids_and_member_fields_are_rejected(api: httpx.AsyncClient) -> None:
    entry = {"topic": "t", "partition": 0, "offset": 1}
    reply = await api.post("/v1/groups/bad group/offsets/commit", json={"partitions": [entry]})
    assert reply.status_code == 400
    reply = await commit(api, "fields", entry, member_id="m-1")
    assert reply.status_code == 400


async def test_too_many_ranges_in_one_request_is_refused(api: httpx.AsyncClient) -> None:
    ranges = [[i * 2, i * 2] for i in range(60_001)]
    reply = await commit(api, "many", {"topic": "t", "partition": 0, "ranges": ranges})
    assert reply.status_code == 400
    assert "max_ranges_per_request" in reply.json()["detail"]
    assert await stored(api, "many") == {}


async def test_sixty_thousand_ranges_are_accepted(api: httpx.AsyncClient) -> None:
    ranges = [[i * 2, i * 2] for i in range(60_000)]
    reply = await commit(api, "sixty", {"topic": "t", "partition": 0, "ranges": ranges[:5_000]})
    assert reply.status_code == 200
    assert len((await stored(api, "sixty"))[("t", 0)]["ranges"]) == 4_999  # [0,0] joined the LSO


async def test_oversized_body_is_refused_with_413(api: httpx.AsyncClient) -> None:
    body = b'{"partitions": [' + b" " * (5 * 1024 * 1024) + b"]}"
    reply = await api.post(
        "/v1/groups/huge/offsets/commit", content=body, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 413
    assert reply.json()["error"] == "INVALID_REQUEST"


async def test_oversized_body_without_content_length_is_refused_with_413(
    api: httpx.AsyncClient,
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"partitions": ['
        for _ in range(5 * 1024):
            yield b" " * 1024
        yield b"]}"

    reply = await api.post(
        "/v1/groups/huge-stream/offsets/commit",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 413
    assert reply.json()["error"] == "INVALID_REQUEST"
    assert await stored(api, "huge-stream") == {}


async def test_fetch_filters_by_topic_and_partition(api: httpx.AsyncClient) -> None:
    await commit(
        api,
        "filter",
        {"topic": "a", "partition": 0, "offset": 1},
        {"topic": "a", "partition": 1, "offset": 2},
        {"topic": "b", "partition": 0, "offset": 3},
    )
    reply = await api.get("/v1/groups/filter/offsets", params={"topic": "a"})
    assert [(p["topic"], p["partition"]) for p in reply.json()["partitions"]] == [
        ("a", 0),
        ("a", 1),
    ]
    reply = await api.get("/v1/groups/filter/offsets", params={"topic": "a", "partition": 1})
    assert [p["stable_offset"] for p in reply.json()["partitions"]] == [2]
    reply = await api.get("/v1/groups/filter/offsets", params={"partition": 1})
    assert reply.status_code == 400
    reply = await api.get("/v1/groups/never-committed/offsets")
    assert reply.json() == {"group_id": "never-committed", "partitions": []}


async def test_standalone_commit_is_refused_while_the_group_has_live_members(
    api: httpx.AsyncClient, database_url: str
) -> None:
    await commit(api, "busy", {"topic": "t", "partition": 0, "offset": 1})
    await insert_live_member(database_url, "busy", "m-live", epoch=3, previous_epoch=2)
    reply = await commit(api, "busy", {"topic": "t", "partition": 0, "offset": 5})
    assert reply.status_code == 409
    assert reply.json()["error"] == "UNKNOWN_MEMBER_ID"
    reply = await commit(
        api, "busy", {"topic": "t", "partition": 0, "offset": 5}, member_id="m-live", member_epoch=1
    )
    assert reply.json()["error"] == "FENCED_MEMBER_EPOCH"
    reply = await commit(
        api,
        "busy",
        {"topic": "t", "partition": 0, "offset": 5},
        member_id="m-other",
        member_epoch=3,
    )
    assert reply.json()["error"] == "UNKNOWN_MEMBER_ID"
    assert (await stored(api, "busy"))[("t", 0)]["stable_offset"] == 1
    for epoch in (3, 2):  # current and previous epoch are both accepted
        reply = await commit(
            api,
            "busy",
            {"topic": "t", "partition": 0, "offset": 5 + epoch},
            member_id="m-live",
            member_epoch=epoch,
        )
        assert reply.status_code == 200, reply.text
    assert (await stored(api, "busy"))[("t", 0)]["stable_offset"] == 8


@pytest_asyncio.fixture(scope="module")
async def capped_api(
    make_migrated_database: MakeDatabase,
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    url = await make_migrated_database()
    app = create_app(
        settings_for_tests(max_ic_ranges_per_partition=3, accept_individual_commit=False), url
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client, url


async def test_individual_commit_switch_off_refuses_ranges_but_not_plain_offsets(
    capped_api: tuple[httpx.AsyncClient, str],
) -> None:
    api, _ = capped_api
    reply = await commit(api, "switch", {"topic": "t", "partition": 0, "ranges": [[1, 2]]})
    assert reply.status_code == 409
    assert reply.json()["error"] == "INDIVIDUAL_COMMIT_NOT_ALLOWED"
    reply = await commit(api, "switch", {"topic": "t", "partition": 0, "offset": 4})
    assert reply.status_code == 200


async def test_too_many_stored_ranges_refuse_the_partition_and_request_a_rebalance(
    capped_api: tuple[httpx.AsyncClient, str],
) -> None:
    api, url = capped_api
    reply = await api.put("/v1/admin/config", json={"accept_individual_commit": True})
    assert reply.status_code == 200
    await commit(
        api, "cap", {"topic": "t", "partition": 0, "ranges": [[10, 10], [20, 20], [30, 30]]}
    )
    reply = await commit(
        api,
        "cap",
        {"topic": "t", "partition": 0, "ranges": [[40, 40]]},
        {"topic": "t", "partition": 1, "ranges": [[40, 40]]},
    )
    assert reply.json()["partitions"] == [
        {
            "topic": "t",
            "partition": 0,
            "error": "MAX_INDIVIDUAL_COMMIT_REACHED",
            "last_stable_offset": 0,
        },
        {"topic": "t", "partition": 1, "error": None, "last_stable_offset": 0},
    ]
    assert (await stored(api, "cap"))[("t", 0)]["ranges"] == [[10, 10], [20, 20], [30, 30]]
    engine = create_async_engine(url)
    async with engine.connect() as connection:
        flagged = (
            await connection.execute(
                text("SELECT rebalance_requested FROM groups WHERE group_id = 'cap'")
            )
        ).scalar_one()
    await engine.dispose()
    assert flagged is True


async def test_concurrent_commits_over_the_cap_all_get_an_answer(
    capped_api: tuple[httpx.AsyncClient, str],
) -> None:
    api, _ = capped_api
    await api.put("/v1/admin/config", json={"accept_individual_commit": True})
    await commit(
        api, "cap-race", {"topic": "t", "partition": 0, "ranges": [[10, 10], [20, 20], [30, 30]]}
    )

    async def over_the_cap(offset: int) -> httpx.Response:
        return await commit(
            api, "cap-race", {"topic": "t", "partition": 0, "ranges": [[offset, offset]]}
        )

    replies = await asyncio.gather(*(over_the_cap(100 + 2 * i) for i in range(8)))
    assert [r.status_code for r in replies] == [200] * 8
    assert {r.json()["partitions"][0]["error"] for r in replies} == {
        "MAX_INDIVIDUAL_COMMIT_REACHED"
    }


async def test_commits_under_a_root_path_are_answered_as_the_fast_path_answers(
    coordinator_app: Any,
) -> None:
    """The fast-path middleware leaves requests under a root path to the router; the
    declared route must give the same answers, errors included."""
    fast = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=coordinator_app), base_url="http://coordinator"
    )
    routed = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=coordinator_app, root_path="/keyrange"),
        base_url="http://coordinator/keyrange",
    )
    entry = {"topic": "t", "partition": 0, "ranges": [[3, 4]], "watermarks": [[0, FULL_END, 2]]}
    as_json = {"content-type": "application/json"}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("alike-a", {"json": {"partitions": [entry]}}),
        ("alike-a", {"json": {"partitions": [{**entry, "ranges": [[2, 2]]}]}}),
        ("bad group", {"json": {"partitions": [entry]}}),
        ("alike-b", {"content": b'{"partitions": [', "headers": as_json}),
        ("alike-b", {"content": b'{"partitions": []}', "headers": {"content-type": "text/plain"}}),
        ("alike-b", {"json": {"partitions": [{**entry, "partition": -1}]}}),
        ("alike-b", {"json": {"partitions": [entry], "member_id": "m-1"}}),
    ]
    async with fast, routed:
        for group, request in cases:
            answers = []
            for client, prefix in ((fast, "fast"), (routed, "routed")):
                reply = await client.post(f"/v1/groups/{prefix}-{group}/offsets/commit", **request)
                answers.append((reply.status_code, reply.headers["content-type"], reply.json()))
            assert answers[0] == answers[1], (group, request)
        fast_state = (await stored(fast, "fast-alike-a"))[("t", 0)]
        routed_state = (await stored(fast, "routed-alike-a"))[("t", 0)]
        assert fast_state == routed_state
        assert fast_state["stable_offset"] == 5
