"""The heartbeat fast path (``coordinator/groups/fast_path.py``) answers as the declared
FastAPI route does: the route still serves requests under a root path, so both are reachable
over one app."""

from __future__ import annotations

from typing import Any

import httpx

from tests.groups.test_heartbeat_api import given_topics


async def test_heartbeats_under_a_root_path_are_answered_as_the_fast_path_answers(
    coordinator_app: Any,
) -> None:
    await given_topics(coordinator_app, t=1)
    fast = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=coordinator_app), base_url="http://coordinator"
    )
    routed = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=coordinator_app, root_path="/keyrange"),
        base_url="http://coordinator/keyrange",
    )
    as_json = {"content-type": "application/json"}
    join = {"member_epoch": 0, "subscribed_topics": ["t"], "client_id": "c"}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("bad group", {"json": join}),
        ("alike", {"content": b'{"member_epoch": ', "headers": as_json}),
        ("alike", {"content": b'{"member_epoch": 0}', "headers": {"content-type": "text/plain"}}),
        ("alike", {"content": b"", "headers": as_json}),
        ("alike", {"json": []}),
        ("alike", {"json": {"member_epoch": "1", "member_id": "m-1"}}),
        ("alike", {"json": {"member_epoch": 1}}),
        ("alike", {"json": {"member_epoch": 0}}),
        ("alike", {"json": {**join, "unknown": 1}}),
        ("alike", {"json": {"member_epoch": 3, "member_id": "m-nobody"}}),
        ("alike", {"json": {"member_epoch": 0, "subscribed_topic_regex": "("}}),
    ]
    async with fast, routed:
        for group, request in cases:
            answers = []
            for client, prefix in ((fast, "fast"), (routed, "routed")):
                reply = await client.post(f"/v1/groups/{prefix}-{group}/heartbeat", **request)
                # The group's name differs by its prefix, which errors may name.
                answer = reply.text.replace(f"{prefix}-", "")
                answers.append((reply.status_code, reply.headers["content-type"], answer))
            assert answers[0] == answers[1], (group, request, answers)
        replies = []
        for client, prefix in ((fast, "fast"), (routed, "routed")):
            joined = (await client.post(f"/v1/groups/{prefix}-g/heartbeat", json=join)).json()
            beat = {
                "member_id": joined["member_id"],
                "member_epoch": joined["member_epoch"],
                "owned": joined["assignment"],
            }
            stable = await client.post(f"/v1/groups/{prefix}-g/heartbeat", json=beat)
            replies.append((stable.status_code, stable.headers["content-type"]))
            body = stable.json()
            assert body["member_id"] == joined["member_id"]
            assert body["assignment"] == joined["assignment"] != []
        assert replies[0] == replies[1] == (200, "application/json")
