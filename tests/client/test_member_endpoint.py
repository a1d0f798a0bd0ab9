"""A member advertises its endpoint with every join and with nothing else: a member fenced
and joining again advertises it again, and its heartbeats never take the coordinator's locked
path for it (docs/api.md, "Member endpoints")."""

from __future__ import annotations

from client.http import CoordinatorClient, HeartbeatReply
from client.membership.exchange import Exchange


async def test_the_endpoint_goes_with_joins_only() -> None:
    async with CoordinatorClient("http://coordinator") as client:
        exchange = Exchange(
            client,
            "g",
            topics=["t"],
            assignor="sticky-join",
            allow_individual_commit=True,
            session_timeout_ms=3_000,
            instance_id=None,
            client_id=None,
            endpoint="http://10.0.0.5:7070",
        )
        assert exchange.request({}, 0, None).to_json()["endpoint"] == "http://10.0.0.5:7070"
        exchange.accept(HeartbeatReply("m-1", 1, 1_000, 3_000))
        assert "endpoint" not in exchange.request({}, 0, None).to_json()
        exchange.forget()
        assert exchange.request({}, 0, None).to_json()["endpoint"] == "http://10.0.0.5:7070"
