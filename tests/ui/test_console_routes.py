"""The console's routes over real HTTP: empty shells for anyone, fragments only for the
admin token, and fragments that draw what the admin API says."""

from __future__ import annotations

import re

import httpx

from tests.ui.conftest import (
    ADMIN_TOKEN,
    IC_RANGE,
    LAG,
    RECORDS,
    STABLE_OFFSET,
    LiveConsole,
    owners,
)
from tests.waiting import until


async def test_pages_are_shells_that_hold_no_data_and_load_nothing_from_elsewhere(
    live_console: LiveConsole,
) -> None:
    async with httpx.AsyncClient(base_url=live_console.url) as anonymous:
        for path in ("/ui", f"/ui/groups/{live_console.group}"):
            page = await anonymous.get(path)
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            policy = page.headers["content-security-policy"]
            assert "default-src 'none'" in policy
            assert "script-src 'self'" in policy
            assert live_console.topic not in page.text
            assert not re.search(r"(src|href)=\"(https?:)?//", page.text)
            assert "<script>" not in page.text


async def test_the_root_leads_to_the_console_and_an_unknown_path_is_not_found_by_name(
    live_console: LiveConsole,
) -> None:
    """Issue 47 item 7: ``GET /`` was a 404 named ``INVALID_REQUEST``."""
    async with httpx.AsyncClient(base_url=live_console.url) as anonymous:
        root = await anonymous.get("/")
        assert (root.status_code, root.headers["location"]) == (307, "/ui")
        landed = await anonymous.get("/", follow_redirects=True)
        assert landed.status_code == 200 and landed.url.path == "/ui"
        unknown = await anonymous.get(
            "/v2/nothing-here", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        assert unknown.status_code == 404
        assert unknown.json()["error"] == "NOT_FOUND"


async def test_fragments_need_the_admin_token(live_console: LiveConsole) -> None:
    async with httpx.AsyncClient(base_url=live_console.url) as anonymous:
        for path in ("/ui/fragments/groups", f"/ui/fragments/groups/{live_console.group}"):
            missing = await anonymous.get(path)
            assert missing.status_code == 401
            assert missing.json()["error"] == "UNAUTHORIZED"
            wrong = await anonymous.get(path, headers={"Authorization": "Bearer wrong"})
            assert wrong.status_code == 401
            right = await anonymous.get(path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert right.status_code == 200


async def test_the_groups_fragment_lists_state_members_and_total_lag(
    live_console: LiveConsole,
) -> None:
    html = await fragment_showing(
        live_console, "/ui/fragments/groups", f'<td class="number lag">{LAG}'
    )
    live_row = _row(html, live_console.group)
    assert '<td class="state">stable</td>' in live_row
    assert '<td class="number members">3</td>' in live_row
    assert f'<td class="number lag">{LAG}</td>' in live_row
    idle_row = _row(html, live_console.idle_group)
    assert '<td class="state">empty</td>' in idle_row


async def test_the_group_fragment_colours_each_members_key_ranges(
    live_console: LiveConsole,
) -> None:
    owned = owners(await live_console.describe())
    html = await fragment_showing(
        live_console,
        f"/ui/fragments/groups/{live_console.group}",
        f'<strong class="lag">{LAG}</strong>',
    )
    drawn = re.findall(
        r'data-owner="([^"]*)"\s+data-first-hash="(\d+)" data-last-hash="(\d+)"', html
    )
    drawn_by_owner: dict[str, list[list[int]]] = {}
    for owner, first, last in drawn:
        drawn_by_owner.setdefault(owner, []).append([int(first), int(last)])
    # The page may be a heartbeat newer than the description; the owners are the same.
    assert set(drawn_by_owner) - {""} == set(owned)
    assert int(drawn[0][1]) == 0
    assert int(drawn[-1][2]) == 2**63 - 1
    for member_id in owned:
        assert f'<tr data-member="{member_id}">' in html
    assert f'<strong class="lag">{LAG}</strong>' in html
    assert f'<strong class="stable-offset">{STABLE_OFFSET}</strong>' in html
    assert '<strong class="oldest-unprocessed">' in html
    assert f'<strong class="high-watermark">{RECORDS}</strong>' in html
    assert f"IC range [{IC_RANGE[0]}, {IC_RANGE[1]}]" in html
    assert html.count('class="watermark"') == 1
    assert 'data-action="range-fetch"' in html
    assert 'data-action="reset"' not in html  # the group has live members


async def test_an_empty_group_offers_the_offset_reset(live_console: LiveConsole) -> None:
    html = (await live_console.api.get(f"/ui/fragments/groups/{live_console.idle_group}")).text
    assert 'data-action="reset"' in html
    assert "No live members" in html


async def test_an_unknown_group_is_a_problem_not_a_page(live_console: LiveConsole) -> None:
    reply = await live_console.api.get("/ui/fragments/groups/no-such-group")
    assert reply.status_code == 404
    assert reply.json()["error"] == "GROUP_ID_NOT_FOUND"
    bad_id = await live_console.api.get("/ui/groups/not%20a%20group")
    assert bad_id.status_code == 400


async def test_only_the_consoles_own_assets_are_served(live_console: LiveConsole) -> None:
    for name, media_type in (("console.js", "text/javascript"), ("console.css", "text/css")):
        reply = await live_console.api.get(f"/ui/static/{name}")
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith(media_type)
    for name in ("shell.html", "..%2Fconsole.py", "views.py"):
        assert (await live_console.api.get(f"/ui/static/{name}")).status_code == 404


async def fragment_showing(live_console: LiveConsole, path: str, text: str) -> str:
    """The fragment once it shows ``text``: the lag needs a high watermark from Kafka, and a
    lookup that did not answer in time leaves it "unknown" for that one reply."""
    fetched: list[str] = []

    async def shows() -> bool:
        reply = await live_console.api.get(path)
        assert reply.status_code == 200, reply.text
        fetched.append(reply.text)
        return text in reply.text

    await until(shows, 30, f"{path} to show {text}")
    return fetched[-1]


def _row(html: str, group: str) -> str:
    start = html.index(f'<tr data-group="{group}">')
    return html[start : html.index("</tr>", start)]
