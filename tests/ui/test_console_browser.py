"""The console in a real browser (headless Chromium): what it draws for a live group of
three members sharing a partition, and that its admin actions work. Screenshots go to the
test's output directory (the docs' screenshots are these)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator
from tests.ui.browser import Browser, chromium_or_skip
from tests.ui.conftest import (
    ADMIN_TOKEN,
    IDLE_STABLE_OFFSET,
    LAG,
    MEMBERS,
    RECORDS,
    STABLE_OFFSET,
    LiveConsole,
    commit,
    owners,
)
from tests.waiting import until

TOKEN_KEY = "keyrange.adminToken"


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-screenshots")


@pytest_asyncio.fixture(scope="module")
async def browser(screenshots: Path) -> AsyncIterator[Browser]:
    chromium_or_skip()
    import asyncio

    started = await asyncio.to_thread(Browser, screenshots)
    try:
        yield started
    finally:
        await asyncio.to_thread(started.quit)


def segment_owners(browser: Browser, topic: str) -> set[str]:
    owners = browser.attributes(f'section[data-topic="{topic}"] rect.segment', "data-owner")
    return set(owners) - {""}


async def test_the_token_is_asked_once_per_tab_and_opens_the_groups_list(
    browser: Browser, live_console: LiveConsole, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # An in-process CLI test earlier in the session may have quietened the access log
    # (coordinator.logs.configure): the requests this test makes must be logged to be checked.
    caplog.set_level(logging.DEBUG, logger="uvicorn.access")
    await browser.run(browser.open, f"{live_console.url}/ui")
    await browser.run(
        browser.wait_for, lambda _: browser.css("#token-input")[0].is_displayed(), "the prompt"
    )
    await browser.run(browser.screenshot, "console-token")
    await browser.run(_enter_token, browser, "not-the-token")
    await browser.run(
        browser.wait_for, lambda _: browser.shows("#token-error", "unknown bearer token"), "refusal"
    )
    await browser.run(_enter_token, browser, ADMIN_TOKEN)
    row = f'tr[data-group="{live_console.group}"]'
    await browser.run(
        browser.wait_for,
        lambda _: browser.text_of(f"{row} .lag") == str(LAG),
        "the group's row with its lag",
    )
    assert await browser.run(browser.text_of, f"{row} .state") == "stable"
    assert await browser.run(browser.text_of, f"{row} .members") == str(MEMBERS)
    await browser.run(browser.screenshot, "console-groups")
    driver = browser.driver
    assert await browser.run(driver.execute_script, f"return sessionStorage['{TOKEN_KEY}']") == (
        ADMIN_TOKEN
    )
    assert await browser.run(driver.get_cookies) == []
    # Another page of the same tab asks no more.
    await browser.run(browser.open, f"{live_console.url}/ui/groups/{live_console.group}")
    await browser.run(browser.wait_for, lambda _: browser.css("#members"), "the group page")
    assert not await browser.run(lambda: browser.css("#token-input")[0].is_displayed())
    assert ADMIN_TOKEN not in await browser.run(lambda: driver.current_url)
    # The browser driver logs what it types; the coordinator's and the server's logs are
    # what must not hold a token.
    served = [
        record.getMessage() + repr(record.__dict__)
        for record in caplog.records
        if record.name.split(".")[0] in ("coordinator", "uvicorn", "keyrange", "sqlalchemy")
    ]
    assert served, "the coordinator logged nothing: the check below would be empty"
    assert not [line for line in served if ADMIN_TOKEN in line or "not-the-token" in line]


async def test_a_deleted_group_says_so_instead_of_its_last_picture(
    browser: Browser, live_console: LiveConsole
) -> None:
    await browser.run(browser.open, f"{live_console.url}/ui/groups/no-such-group")
    await browser.run(
        browser.wait_for,
        lambda _: browser.shows("#view", "GROUP_ID_NOT_FOUND"),
        "the page to say the group does not exist",
    )


async def test_the_group_page_draws_who_owns_which_keys_and_the_offsets(
    browser: Browser, live_console: LiveConsole
) -> None:
    await browser.run(browser.open, f"{live_console.url}/ui/groups/{live_console.group}")
    expected = set(owners(await live_console.describe()))

    section = f'section[data-topic="{live_console.topic}"]'

    # The lag needs a high watermark from Kafka: a refresh that could not read one in time
    # says "unknown", and the next one the number.
    def drawn(_: object) -> bool:
        lag = browser.text_of(f"{section} .lag")
        owners_drawn = segment_owners(browser, live_console.topic) == expected
        return owners_drawn and lag == str(LAG)

    await browser.run(browser.wait_for, drawn, "each member's key ranges and the lag")
    rows = await browser.run(browser.attributes, "#members tbody tr", "data-member")
    assert set(rows) == expected
    assert await browser.run(browser.text_of, f"{section} .stable-offset") == str(STABLE_OFFSET)
    assert await browser.run(browser.text_of, f"{section} .high-watermark") == str(RECORDS)
    assert len(await browser.run(browser.css, f"{section} rect.ic-range")) == 1
    assert len(await browser.run(browser.css, f"{section} rect.watermark")) == 1
    # Issue 47 item 7: watermark pieces are painted over the IC bands, in their legend's
    # orange (under the bands' blue they read as grey), and member ids keep to one line.
    painted = await browser.run(browser.attributes, f"{section} svg.offsetbar rect", "class")
    assert painted.index("watermark") > painted.index("ic-range"), painted
    assert await browser.run(browser.attributes, f"{section} rect.watermark", "fill") == ["#f28e2b"]
    assert await browser.run(browser.attributes, f"{section} rect.watermark", "fill-opacity") == [
        "None"
    ]
    white_space = await browser.run(
        browser.driver.execute_script,
        "return getComputedStyle(document.querySelector('td.member-id')).whiteSpace",
    )
    assert white_space == "nowrap"
    widths = await browser.run(browser.attributes, f"{section} rect.segment", "width")
    assert sum(float(width) for width in widths) == pytest.approx(1000, abs=0.01)
    # The offset axis is the whole log, from its start to the high watermark.
    ends = await browser.run(browser.text_of, f"{section} .axis-ends")
    assert ends.split() == ["0", f"{RECORDS:,}"], ends

    # Each refresh samples the group: after two, its lag and rate are lines over time.
    def trend_drawn(_: object) -> bool:
        points = browser.attributes("#lag-trend polyline", "points")
        return bool(points) and len(points[0].split()) >= 2

    await browser.run(browser.wait_for, trend_drawn, "the lag's line over the last minutes")
    lag_now = await browser.run(browser.text_of, "#lag-trend .latest")
    assert lag_now == f"{LAG:,}"
    # Nothing is committed meanwhile: the group processes 0 records a second.
    assert await browser.run(browser.text_of, "#rate-trend .latest") == "0.0"
    assert await browser.run(browser.foreign_requests, live_console.url) == []
    await browser.run(browser.screenshot, "console-group")


async def test_a_member_whose_call_is_stuck_shows_the_key_it_holds_and_for_how_long(
    browser: Browser, live_console: LiveConsole
) -> None:
    holder = live_console.members[0]
    assert holder.member_id is not None
    (first_hash, _), *_ = owners(await live_console.describe())[holder.member_id]
    holder.report_stuck(
        [
            {
                "topic": live_console.topic,
                "partition": 0,
                "key_hash": first_hash,
                "offset": 12,
                "running_s": 42.5,
            }
        ]
    )

    async def reported() -> bool:
        described = await live_console.describe()
        return any(m["stuck"] for m in described["members"])

    await until(reported, 30, "the stuck call to be reported")
    try:
        await browser.run(browser.open, f"{live_console.url}/ui/groups/{live_console.group}")
        call = f'li.stuck-call[data-member="{holder.member_id}"]'
        await browser.run(browser.wait_for, lambda _: browser.css(call), "the stuck call's line")
        assert await browser.run(browser.text_of, f"{call} .key-hash") == str(first_hash)
        assert await browser.run(browser.text_of, f"{call} .offset") == "12"
        running_for = await browser.run(browser.text_of, f"{call} .running-for")
        assert running_for.endswith(" s") and float(running_for[:-2]) >= 42.5, running_for
        line = await browser.run(browser.text_of, call)
        assert f"held by a stuck call at offset 12 for {running_for}" in line, line
        assert holder.member_id in line and "(client worker-0)" in line, line
        row = f'#members tr[data-member="{holder.member_id}"] .stuck'
        assert await browser.run(browser.text_of, row) == "1 stuck"
        for other in live_console.members[1:]:
            quiet = f'#members tr[data-member="{other.member_id}"] .stuck'
            assert await browser.run(browser.text_of, quiet) == "-"
        assert "1 stuck call still running" in await browser.run(browser.text_of, "#stuck-warning")
        marks = await browser.run(
            browser.attributes,
            f'section[data-topic="{live_console.topic}"] rect.stuck-mark',
            "data-key-hash",
        )
        assert marks == [str(first_hash)]
        await browser.run(browser.screenshot, "console-stuck-call")
    finally:
        holder.report_stuck([])

        async def cleared() -> bool:
            described = await live_console.describe()
            return not any(m["stuck"] for m in described["members"])

        await until(cleared, 30, "the stuck call to be cleared")
    await browser.run(
        browser.wait_for, lambda _: not browser.css("li.stuck-call"), "the line to go"
    )
    assert not await browser.run(browser.css, "#stuck-warning")


async def test_removing_a_member_hands_its_keys_to_the_others(
    browser: Browser, live_console: LiveConsole
) -> None:
    removed = live_console.members[-1]
    await browser.run(browser.open, f"{live_console.url}/ui/groups/{live_console.group}")
    button = f'button[data-action="remove-member"][data-member="{removed.member_id}"]'
    await browser.run(browser.wait_for, lambda _: browser.css(button), "the remove button")
    await browser.run(browser.click, button)
    message = await browser.run(browser.accept_confirmation)
    assert removed.member_id is not None and removed.member_id in message

    async def others_own_everything() -> bool:
        owned = owners(await live_console.describe())
        return removed.member_id not in owned and len(owned) == MEMBERS - 1

    await until(others_own_everything, 30, "the removed member's keys to move")
    remaining = set(owners(await live_console.describe()))

    def drawn_for_the_others(_: object) -> bool:
        return segment_owners(browser, live_console.topic) == remaining

    await browser.run(browser.wait_for, drawn_for_the_others, "the bar to follow")
    assert (await browser.run(browser.text_of, "#outcome")).startswith("done: Remove member")
    await browser.run(browser.screenshot, "console-member-removed")


async def test_switching_accept_range_fetch_off_from_the_topic_table(
    browser: Browser, live_console: LiveConsole
) -> None:
    await browser.run(browser.open, f"{live_console.url}/ui/groups/{live_console.group}")
    button = f'button[data-action="range-fetch"][data-topic="{live_console.topic}"]'
    await browser.run(browser.wait_for, lambda _: browser.css(button), "the switch")
    await browser.run(browser.click, button)
    assert "off" in await browser.run(browser.accept_confirmation)
    row = f'tr[data-topic="{live_console.topic}"] .accept-range-fetch'
    await browser.run(browser.wait_for, lambda _: browser.text_of(row) == "off", "the switch")
    reply = await live_console.api.get(f"/v1/admin/topics/{live_console.topic}/config")
    assert reply.json() == {
        "topic": live_console.topic,
        "accept_range_fetch": False,
        "explicit": True,
    }

    # The switch applies from the group's next rebalance (docs/operations.md, "The web console").
    rebalance = await live_console.api.post(f"/v1/admin/groups/{live_console.group}/rebalance")
    assert rebalance.status_code == 200, rebalance.text

    def one_owner(_: object) -> bool:
        return len(segment_owners(browser, live_console.topic)) == 1

    await browser.run(browser.wait_for, one_owner, "one member to own the whole partition")
    await browser.run(browser.screenshot, "console-range-fetch-off")


async def test_resetting_an_empty_groups_offsets_after_confirmation(
    browser: Browser, live_console: LiveConsole
) -> None:
    await browser.run(browser.open, f"{live_console.url}/ui/groups/{live_console.idle_group}")
    form = f'form[data-action="reset"][data-topic="{live_console.topic}"]'
    await browser.run(browser.wait_for, lambda _: browser.css(form), "the reset form")
    section = f'section[data-topic="{live_console.topic}"] .stable-offset'
    assert await browser.run(browser.text_of, section) == str(IDLE_STABLE_OFFSET)

    def submit(offset: str) -> None:
        # The group is empty, so a refresh may replace the form while this types: retried.
        def typed(_: object) -> bool:
            field = browser.css(f'{form} input[name="to_offset"]')[0]
            field.clear()
            field.send_keys(offset)
            browser.css(f"{form} button")[0].click()
            return True

        browser.wait_for(typed, "the reset form to take the offset")

    await browser.run(submit, "3")
    assert "to 3" in await browser.run(browser.accept_confirmation)
    await browser.run(browser.wait_for, lambda _: browser.text_of(section) == "3", "the reset")
    stored = await live_console.api.get(f"/v1/admin/groups/{live_console.idle_group}/offsets")
    assert stored.json()["partitions"][0]["stable_offset"] == 3
    await browser.run(browser.screenshot, "console-reset")


async def test_a_coordinator_without_tokens_opens_the_console_without_asking(
    browser: Browser,
    make_migrated_database: MakeDatabase,
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
) -> None:
    coordinator = await start_coordinator(await make_migrated_database())
    async with httpx.AsyncClient(base_url=coordinator.url) as api:
        await commit(api, "open-group", "some-topic", offset=7)
    await browser.run(browser.driver.execute_script, "sessionStorage.clear()")
    await browser.run(browser.open, f"{coordinator.url}/ui")
    await browser.run(
        browser.wait_for, lambda _: browser.css('tr[data-group="open-group"]'), "the groups"
    )
    assert not await browser.run(lambda: browser.css("#token-input")[0].is_displayed())


async def test_the_api_docs_render_from_the_coordinator_alone(
    browser: Browser, live_console: LiveConsole
) -> None:
    await browser.run(browser.open, f"{live_console.url}/docs")
    await browser.run(
        browser.wait_for,
        lambda _: browser.shows(".swagger-ui .info .title", "Keyrange coordinator"),
        "Swagger UI to render the OpenAPI document",
    )
    assert await browser.run(browser.css, ".opblock")
    assert await browser.run(browser.foreign_requests, live_console.url) == []
    await browser.run(browser.screenshot, "docs")


def _enter_token(browser: Browser, token: str) -> None:
    field = browser.css("#token-input")[0]
    field.clear()
    field.send_keys(token)
    browser.css('#token-form button[type="submit"]')[0].click()
