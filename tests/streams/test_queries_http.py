"""Queries over HTTP against the real coordinator (with tokens) and broker: two instances
split one partition's keys; each serves its own keys, forwards a key the other owns (or
redirects to it when asked), scans only its own part, and refuses callers the coordinator
would refuse for the group (docs/streams.md, "Queries over HTTP")."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from client.errors import EndpointNotAllowed
from client.http import CoordinatorClient
from client.streams import StreamsApp
from client.streams.config import StreamsConfig
from tests.fixtures.coordinator import RunningCoordinator
from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    accept_range_fetch,
    count_topology,
    increments,
    produce,
    running,
)
from tests.waiting import until

ADMIN = "admin-token-for-queries"
CLIENT = "client-token-of-team-iq"
OTHER_TEAM = "client-token-of-team-other"
KEYS = [f"k{n:02d}" for n in range(40)]


@pytest_asyncio.fixture
async def secured(
    database_url: str, kafka_bootstrap: str, start_coordinator: Any
) -> AsyncIterator[RunningCoordinator]:
    coordinator: RunningCoordinator = await start_coordinator(
        database_url,
        kafka_bootstrap=kafka_bootstrap,
        admin_tokens=[ADMIN],
        client_tokens=[
            {"token": CLIENT, "group_prefixes": ["iq-"]},
            {"token": OTHER_TEAM, "group_prefixes": ["other-"]},
        ],
    )
    yield coordinator


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def get(url: str, token: str | None = CLIENT, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.get(url, params=params, headers={} if token is None else bearer(token))


async def test_two_instances_serve_forward_redirect_and_scan_their_keys(
    secured: RunningCoordinator, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    words, counts = await make_topic(1), await make_topic(1)
    async with CoordinatorClient(secured.url, token=ADMIN) as admin:
        await admin.set_accept_range_fetch(words)
    await produce(kafka_bootstrap, words, increments(KEYS))

    def config(name: str) -> StreamsConfig:
        # A client token of the group's team: the owner look-up needs no admin token.
        return StreamsConfig(
            application_id=f"iq-{words}",
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=secured.url,
            token=CLIENT,
            state_dir=tmp_path / name,
            commit_interval_ms=200,
            session_timeout_ms=3_000,
            show_progress=False,
            instance_id=name,
            query_port=0,
        )

    apps = {name: StreamsApp(count_topology(words, counts), config(name)) for name in "ab"}
    owners: dict[str, str] = {}

    async def split_and_counted() -> bool:
        owners.clear()
        for key in KEYS:
            answers = {name: await app.query("counts", key) for name, app in apps.items()}
            local = [name for name, answer in answers.items() if answer.local]
            if len(local) != 1 or answers[local[0]].value != 1:
                return False
            owners[key] = local[0]
        return set(owners.values()) == {"a", "b"}

    async with running(apps["a"]), running(apps["b"]):
        await until(split_and_counted, 90, "both instances owning counted keys")
        a, b = (apps[name].query_endpoint for name in "ab")
        assert a is not None and b is not None
        (remote, *_), (local, *_) = ([key for key in KEYS if owners[key] == name] for name in "ba")

        # What the in-process query says of the other's key: who, and where it serves (once
        # b's heartbeat told the coordinator what it owns).
        async def named_b() -> bool:
            answer = await apps["a"].query("counts", remote)
            return (answer.local, answer.owner, answer.endpoint) == (False, "b", b)

        await until(named_b, 30, "a naming b and its address as the owner")

        served = await get(f"{a}/v1/stores/counts/keys/{local}")
        assert served.status_code == 200, served.text
        assert served.json() == {"store": "counts", "key": local, "value": 1, "served_by": "a"}

        # Forwarded: asked of a, answered by b, through a.
        forwarded = await get(f"{a}/v1/stores/counts/keys/{remote}")
        assert forwarded.status_code == 200, forwarded.text
        assert forwarded.json() == {"store": "counts", "key": remote, "value": 1, "served_by": "b"}

        # Redirected: a names b's address, and b answers there.
        redirect = await get(f"{a}/v1/stores/counts/keys/{remote}", redirect="true")
        assert redirect.status_code == 307, redirect.text
        assert redirect.json() == {"owner": "b", "endpoint": b}
        # Only the route's own parameters go on: ``redirect`` is not one of them.
        location = redirect.headers["Location"]
        assert location == f"{b}/v1/stores/counts/keys/{remote}"
        followed = await get(location)
        assert (followed.status_code, followed.json()["served_by"]) == (200, "b")

        # Scans answer from the instance's own keys; together they are the store.
        scanned: dict[str, list[str]] = {}
        for name, url in (("a", a), ("b", b)):
            reply = await get(f"{url}/v1/stores/counts/range")
            assert reply.status_code == 200, reply.text
            assert (reply.json()["served_by"], reply.json()["truncated"]) == (name, False)
            scanned[name] = [entry["key"] for entry in reply.json()["entries"]]
            assert scanned[name] == sorted(k for k in KEYS if owners[k] == name)
        bounded = await get(f"{a}/v1/stores/counts/range", **{"from": "k10", "to": "k19"})
        assert [e["key"] for e in bounded.json()["entries"]] == [
            k for k in scanned["a"] if "k10" <= k <= "k19"
        ]
        limited = await get(f"{a}/v1/stores/counts/range", limit="1")
        assert (len(limited.json()["entries"]), limited.json()["truncated"]) == (1, True)

        # A request already forwarded once is not forwarded again: the key moved meanwhile.
        async with httpx.AsyncClient(timeout=10) as http:
            hop = await http.get(
                f"{b}/v1/stores/counts/keys/{local}",
                headers={**bearer(CLIENT), "Keyrange-Forwarded-By": "a"},
            )
        assert (hop.status_code, hop.json()["error"]) == (503, "NOT_OWNER"), hop.text
        assert hop.headers["Retry-After"] == "1"

        missing = await get(f"{a}/v1/stores/counts/keys/never-counted", redirect="true")
        assert missing.status_code in (307, 404), missing.text
        unknown = await get(f"{a}/v1/stores/nowhere/keys/{local}")
        assert (unknown.status_code, unknown.json()["error"]) == (404, "UNKNOWN_STORE")
        # Time ranges are for window stores; this one keeps plain values.
        windows = await get(f"{a}/v1/stores/counts/keys/{local}/windows")
        assert (windows.status_code, windows.json()["error"]) == (400, "NOT_A_WINDOW_STORE")

        # The coordinator's auth applies, on the instance asked and on the owner behind it.
        for url in (f"{a}/v1/stores/counts/keys/{local}", f"{a}/v1/stores/counts/keys/{remote}"):
            anonymous = await get(url, token=None)
            assert anonymous.status_code == 401, anonymous.text
            assert (await get(url, token="not-a-token")).status_code == 401
            other_team = await get(url, token=OTHER_TEAM)
            assert (other_team.status_code, other_team.json()["error"]) == (403, "FORBIDDEN")
            assert (await get(url, token=ADMIN)).status_code == 200
        refused_scan = await get(f"{b}/v1/stores/counts/range", token=None)
        assert refused_scan.status_code == 401
        async with httpx.AsyncClient(timeout=10) as http:
            posted = await http.post(f"{a}/v1/stores/counts/keys/{local}", headers=bearer(CLIENT))
        assert posted.status_code == 405


async def test_an_owner_serving_no_queries_is_named_and_an_open_coordinator_admits_all(
    coordinator_url: str, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    words, counts = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, words)
    await produce(kafka_bootstrap, words, increments(KEYS))

    def config(name: str, **extra: Any) -> StreamsConfig:
        return StreamsConfig(
            application_id=f"iq-open-{words}",
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=coordinator_url,
            state_dir=tmp_path / name,
            commit_interval_ms=200,
            session_timeout_ms=3_000,
            show_progress=False,
            instance_id=name,
            **extra,
        )

    serving = StreamsApp(count_topology(words, counts), config("serving", query_port=0))
    silent = StreamsApp(count_topology(words, counts), config("silent"))
    theirs: list[str] = []

    async def split() -> bool:
        theirs[:] = [key for key in KEYS if (await silent.query("counts", key)).local]
        return 0 < len(theirs) < len(KEYS)

    async with running(serving), running(silent):
        await until(split, 90, "the silent instance owning some keys")
        assert silent.query_endpoint is None
        url = f"{serving.query_endpoint}/v1/stores/counts/keys/{theirs[0]}"

        async def named() -> httpx.Response | None:
            reply = await get(url, token=None)
            return reply if reply.json().get("error") == "OWNER_NOT_SERVING" else None

        await until(named, 30, "the owner named")
        reply = await get(url, token=None)
        assert reply.status_code == 503
        assert reply.json()["owner"] == "silent"


@pytest.mark.parametrize("port", [-1, 65536])
def test_the_query_port_is_checked(port: int, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="query_port"):
        StreamsConfig("iq-x", "b:9092", "http://c", state_dir=tmp_path, query_port=port)


def test_the_advertised_address_is_an_http_url(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="query_advertised_url"):
        StreamsConfig("iq-x", "b:9092", "http://c", query_port=0, query_advertised_url="host:7070")


class Listener(BaseHTTPRequestHandler):
    """What a member's advertised address may really be: anything. It answers every request
    with something that is no query document, and keeps what it was sent."""

    seen: list[tuple[str, dict[str, str]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, dict(self.headers.items())))
        body = b"instance metadata: secret"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


async def test_an_advertised_address_never_receives_a_callers_token_nor_its_parameters(
    secured: RunningCoordinator, kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A member of the group advertises a listener of its own: a caller's admin token and the
    caller's own parameters never reach it, and what it answers is not relayed (H3 of the
    round-3 safety review)."""
    words, counts = await make_topic(1), await make_topic(1)
    async with CoordinatorClient(secured.url, token=ADMIN) as admin:
        await admin.set_accept_range_fetch(words)
    await produce(kafka_bootstrap, words, increments(KEYS))
    listener = ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    Listener.seen = []
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    elsewhere = f"http://127.0.0.1:{listener.server_port}"

    def config(name: str, **extra: Any) -> StreamsConfig:
        return StreamsConfig(
            application_id=f"iq-listened-{words}",
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=secured.url,
            token=CLIENT,
            state_dir=tmp_path / name,
            commit_interval_ms=200,
            session_timeout_ms=3_000,
            show_progress=False,
            instance_id=name,
            query_port=0,
            **extra,
        )

    honest = StreamsApp(count_topology(words, counts), config("honest"))
    rogue = StreamsApp(
        count_topology(words, counts), config("rogue", query_advertised_url=elsewhere)
    )
    theirs: list[str] = []

    async def named_rogue() -> bool:
        theirs[:] = [key for key in KEYS if (await rogue.query("counts", key)).local]
        if not theirs:
            return False
        answer = await honest.query("counts", theirs[0])
        return answer.endpoint == elsewhere

    try:
        async with running(honest), running(rogue):
            await until(named_rogue, 90, "the honest instance naming the rogue's address")
            url = f"{honest.query_endpoint}/v1/stores/counts/keys/{theirs[0]}"
            forwarded = await get(url, token=ADMIN, x="1", key_encoding="utf-8", to_ms="5")
            redirect = await get(url, token=ADMIN, x="1", redirect="true")
    finally:
        listener.shutdown()
        listener.server_close()
    assert len(Listener.seen) == 1, Listener.seen
    path, headers = Listener.seen[0]
    sent = {name.lower(): value for name, value in headers.items()}
    # The forward presents the instance's own token, a token of the group: never the caller's.
    assert sent.get("authorization") == f"Bearer {CLIENT}", headers
    assert ADMIN not in str(headers)
    assert path == f"/v1/stores/counts/keys/{theirs[0]}?key_encoding=utf-8&to_ms=5"
    # What the listener answered is no query document: the caller is told, not given it.
    assert forwarded.status_code == 502, forwarded.text
    assert forwarded.json()["error"] == "OWNER_UNREACHABLE"
    assert "secret" not in forwarded.text
    assert redirect.status_code == 307, redirect.text
    assert redirect.headers["Location"] == f"{elsewhere}/v1/stores/counts/keys/{theirs[0]}"


async def test_an_instance_advertising_a_host_the_operator_did_not_allow_does_not_start(
    database_url: str,
    kafka_bootstrap: str,
    start_coordinator: Any,
    make_topic: MakeTopic,
    tmp_path: Path,
) -> None:
    coordinator: RunningCoordinator = await start_coordinator(
        database_url, kafka_bootstrap=kafka_bootstrap, allowed_endpoint_hosts=["10.9.0.0/16"]
    )
    words, counts = await make_topic(1), await make_topic(1)
    app = StreamsApp(
        count_topology(words, counts),
        StreamsConfig(
            application_id=f"iq-refused-{words}",
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=coordinator.url,
            state_dir=tmp_path,
            show_progress=False,
            query_port=0,
            query_advertised_url="http://169.254.169.254",
        ),
    )
    with pytest.raises(EndpointNotAllowed, match="allowed_endpoint_hosts"):
        await asyncio.wait_for(app.run(), 60)
