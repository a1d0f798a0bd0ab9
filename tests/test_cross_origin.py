"""Cross-site request forgery: a state-changing request that a browser sent from another
origin's page is refused before anything else looks at it; programs (no browser headers),
the coordinator's own pages and reads pass."""

from __future__ import annotations

import httpx
import pytest

REBALANCE = "/v1/admin/groups/csrf-group/rebalance"
COMMIT = "/v1/groups/csrf-group/offsets/commit"
COMMIT_BODY = {"partitions": [{"topic": "t", "partition": 0, "offset": 1}]}


def refused(reply: httpx.Response) -> bool:
    return reply.status_code == 403 and "another origin" in reply.json()["detail"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://coordinator"},
        {"Origin": "http://evil.example"},
        {"Origin": "http://coordinator:8080"},
        {"Origin": "null"},
    ],
)
async def test_a_state_change_from_another_origins_page_is_refused(
    api: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    assert refused(await api.post(REBALANCE, headers=headers))
    # The commit fast path is guarded as well, before its body is read.
    commit = await api.post(COMMIT, json=COMMIT_BODY, headers=headers)
    assert refused(commit)
    assert refused(await api.delete("/v1/admin/groups/csrf-group", headers=headers))


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Sec-Fetch-Site": "same-origin", "Origin": "http://coordinator"},
        {"Sec-Fetch-Site": "none"},
        {"Origin": "http://coordinator"},
    ],
)
async def test_programs_and_the_coordinators_own_pages_pass(
    api: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    commit = await api.post(COMMIT, json=COMMIT_BODY, headers=headers)
    assert commit.status_code == 200, commit.text
    assert (await api.post(REBALANCE, headers=headers)).status_code == 200


async def test_reads_from_another_origin_are_not_refused(api: httpx.AsyncClient) -> None:
    """The browser keeps the answer from the other page (no CORS headers); refusing the
    read itself would only break links into the console."""
    reply = await api.get("/v1/admin/groups", headers={"Sec-Fetch-Site": "cross-site"})
    assert reply.status_code == 200
