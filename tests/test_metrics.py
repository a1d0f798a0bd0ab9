"""``/metrics`` carries no tenant data (group ids, topics, per-partition lag) unless the
operator opts in or the scraper presents a metrics token; the admin API keeps the per-group
figures for admin-scope callers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from coordinator.app import create_app
from tests.fixtures.coordinator import MakeDatabase, settings_for_tests
from tests.waiting import until

METRICS_TOKEN = "metrics-token-0123456789"
ADMIN_TOKEN = "admin-token-0123456789"
TENANT_LABELS = re.compile(r'\{[^}]*\b(group_id|topic|partition)="')


@asynccontextmanager
async def serving(database_url: str, **settings: object) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings_for_tests(**settings), database_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client


async def join_and_commit(api: httpx.AsyncClient, group: str, **headers: str) -> None:
    reply = await api.post(
        f"/v1/groups/{group}/heartbeat",
        json={"member_epoch": 0, "subscribed_topics": ["payments"]},
        headers=headers,
    )
    assert reply.status_code == 200, reply.text
    member = reply.json()
    reply = await api.post(
        f"/v1/groups/{group}/offsets/commit",
        json={
            "member_id": member["member_id"],
            "member_epoch": member["member_epoch"],
            "partitions": [{"topic": "payments", "partition": 0, "offset": 5}],
        },
        headers=headers,
    )
    assert reply.status_code == 200, reply.text


async def scrape(api: httpx.AsyncClient, **headers: str) -> str:
    reply = await api.get("/metrics", headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.text


async def test_by_default_metrics_name_no_group_topic_or_partition(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(await make_migrated_database()) as api:
        await join_and_commit(api, "team-secret-group")
        # The aggregate gauges are process-wide, and the suite runs other coordinators in this
        # process that set them to their own databases' figures: their presence is what holds
        # here (their values are tested against the database in tests/groups/test_gauges.py).
        await until(
            lambda: _exports(api, "keyrange_live_members", "keyrange_groups"),
            10,
            "the aggregate gauges",
        )
        exposition = await scrape(api)
        assert "team-secret-group" not in exposition
        assert "payments" not in exposition
        assert not TENANT_LABELS.search(exposition), TENANT_LABELS.search(exposition)


async def test_a_metrics_token_unlocks_the_per_group_series(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(
        await make_migrated_database(),
        metrics_tokens=[METRICS_TOKEN],
        admin_tokens=[ADMIN_TOKEN],
    ) as api:
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        await join_and_commit(api, "orders-billing", **admin)
        scraper = {"authorization": f"Bearer {METRICS_TOKEN}"}
        await until(
            lambda: _has(api, 'keyrange_group_members{group_id="orders-billing"} 1.0', **scraper),
            10,
            "the member gauge of the group, for the metrics token",
        )
        assert "orders-billing" not in await scrape(api)
        for refused in (f"Bearer {ADMIN_TOKEN}", "Bearer wrong-token", "Basic abc"):
            reply = await api.get("/metrics", headers={"authorization": refused})
            assert (reply.status_code, reply.json()["error"]) == (401, "UNAUTHORIZED")
        # Admin-scope callers keep the per-group figures through the admin API.
        described = (await api.get("/v1/admin/groups/orders-billing", headers=admin)).json()
        assert len(described["members"]) == 1
        assert described["partitions"][0]["stable_offset"] == 5


async def test_the_operator_may_opt_in_to_per_group_series_for_everyone(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(await make_migrated_database(), metrics_group_labels=True) as api:
        await join_and_commit(api, "opted-in")
        await until(
            lambda: _has(api, 'keyrange_group_members{group_id="opted-in"} 1.0'),
            10,
            "the member gauge of the group, unauthenticated",
        )
        assert 'keyrange_group_member_load{bound="max",group_id="opted-in"}' in await scrape(api)


async def test_stuck_calls_are_counted_per_group_for_the_token_and_in_total_for_anyone(
    make_migrated_database: MakeDatabase,
) -> None:
    async with serving(await make_migrated_database(), metrics_tokens=[METRICS_TOKEN]) as api:
        reply = await api.post(
            "/v1/groups/stuck-payments/heartbeat",
            json={
                "member_epoch": 0,
                "subscribed_topics": ["payments"],
                "stuck": [
                    {
                        "topic": "payments",
                        "partition": 0,
                        "key_hash": h,
                        "offset": 7,
                        "running_s": 90.0,
                    }
                    for h in (11, 12)
                ],
            },
        )
        assert reply.status_code == 200, reply.text
        scraper = {"authorization": f"Bearer {METRICS_TOKEN}"}
        await until(
            lambda: _has(
                api, 'keyrange_member_stuck_calls{group_id="stuck-payments"} 2.0', **scraper
            ),
            10,
            "the group's stuck calls, for the metrics token",
        )
        longest = next(
            float(line.rpartition(" ")[2])
            for line in (await scrape(api, **scraper)).splitlines()
            if line.startswith('keyrange_member_stuck_call_max_seconds{group_id="stuck-payments"}')
        )
        assert 90 <= longest < 120
        # The totals name no group: anyone may alert on them (values: tests/groups).
        exposition = await scrape(api)
        assert "stuck-payments" not in exposition
        assert _exports_text(exposition, "keyrange_stuck_calls", "keyrange_stuck_call_max_seconds")


def _exports_text(exposition: str, *names: str) -> bool:
    """Whether the exposition has a sample of every unlabelled metric named."""
    samples = {line.split(" ")[0] for line in exposition.splitlines()}
    return all(name in samples for name in names)


async def _has(api: httpx.AsyncClient, line: str, **headers: str) -> bool:
    return line in (await scrape(api, **headers)).splitlines()


async def _exports(api: httpx.AsyncClient, *names: str) -> bool:
    """Whether one scrape has a sample of every unlabelled metric named."""
    return _exports_text(await scrape(api), *names)
