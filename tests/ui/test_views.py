"""The console's view of a group, computed from admin replies built by hand."""

from __future__ import annotations

from datetime import UTC, datetime

from client.protocol.keyspace import HASH_MAX
from coordinator.admin.schemas import AdminGroupDescription, AdminPartitionOffsets, GroupSummary
from coordinator.core.trend import GroupTrend
from coordinator.groups.schemas import MemberDescription, SliceJson, StuckCallDescription
from coordinator.ui.drawing import UNOWNED_COLOUR
from coordinator.ui.pages import templates
from coordinator.ui.views import GroupPage, group_page, group_rows, topics_of

NOW = datetime(2026, 1, 1, tzinfo=UTC)
HALF = 2**62


def page_of(described: AdminGroupDescription) -> GroupPage:
    return group_page(described, [], {}, GroupTrend())


def member(member_id: str, *owned: SliceJson) -> MemberDescription:
    return MemberDescription(
        member_id=member_id,
        instance_id=None,
        client_id=f"client-{member_id}",
        client_host="10.0.0.1",
        joined_at=NOW,
        last_heartbeat=NOW,
        expires_at=NOW,
        member_epoch=4,
        subscribed_topics=["orders"],
        subscribed_topic_regex=None,
        assignor=None,
        allow_individual_commit=True,
        session_timeout_ms=10_000,
        owned=list(owned),
        assigned=list(owned),
        target=list(owned),
    )


def offsets(partition: int, stable: int, high: int | None) -> AdminPartitionOffsets:
    return AdminPartitionOffsets(
        topic="orders",
        partition=partition,
        stable_offset=stable,
        ranges=[(stable + 2, stable + 3)],
        watermarks=[(0, HALF - 1, stable + 5)],
        metadata=None,
        ic_offsets=2,
        high_watermark=high,
        lag=None if high is None else high - stable,
    )


def description(*partitions: AdminPartitionOffsets) -> AdminGroupDescription:
    return AdminGroupDescription(
        group_id="g",
        state="stable",
        assignor="round-robin",
        group_epoch=7,
        rebalance_requested=False,
        rebalance_reason=None,
        members=[
            member("m-b", SliceJson(topic="orders", partition=0, ranges=[(HALF, HASH_MAX)])),
            member(
                "m-a",
                SliceJson(topic="orders", partition=0, ranges=[(0, HALF - 1)]),
                SliceJson(topic="orders", partition=1, ranges=[(0, HASH_MAX)]),
            ),
        ],
        partitions=list(partitions),
    )


def test_partitions_owned_or_committed_are_drawn_in_order_with_their_owners() -> None:
    page = page_of(description(offsets(2, 10, 20), offsets(0, 5, 9)))
    assert [(view.topic, view.partition) for view in page.partitions] == [
        ("orders", 0),
        ("orders", 1),
        ("orders", 2),
    ]
    first, second, third = page.partitions
    assert [(s.owner, s.first_hash) for s in first.segments] == [("m-a", 0), ("m-b", HALF)]
    assert second.offsets is None
    assert [s.colour for s in third.segments] == [UNOWNED_COLOUR]
    assert first.offsets is not None
    assert first.offsets.lag == 4
    assert [mark.label for mark in first.offsets.ic_bands] == ["IC range [7, 8]"]
    assert first.offsets.watermark_pieces[0].hash_span.width == 0.5


def test_members_are_listed_by_id_with_their_colour_and_share_of_the_keys() -> None:
    page = page_of(description(offsets(0, 5, 9)))
    assert [row.member_id for row in page.members] == ["m-a", "m-b"]
    colours = {row.member_id: row.colour for row in page.members}
    segment_colours = {s.owner: s.colour for s in page.partitions[0].segments}
    assert segment_colours == colours
    # m-a owns half of partition 0 and all of partition 1: three quarters of two partitions.
    assert [row.key_share for row in page.members] == [0.75, 0.25]


def test_total_lag_is_unknown_while_a_high_watermark_is() -> None:
    assert page_of(description(offsets(0, 5, 9), offsets(1, 0, 3))).total_lag == 7
    assert page_of(description(offsets(0, 5, 9), offsets(1, 0, None))).total_lag is None


def test_the_groups_list_sums_the_lag_of_every_partition() -> None:
    summary = GroupSummary(
        group_id="g", state="stable", assignor=None, members=2, partitions=2, created_at=NOW
    )
    (row,) = group_rows([summary], [[offsets(0, 5, 9), offsets(1, 0, 3)]])
    assert row.total_lag == 7
    (unknown,) = group_rows([summary], [[offsets(0, 5, None)]])
    assert unknown.total_lag is None


def test_topic_configs_cover_subscriptions_and_committed_topics() -> None:
    described = description(offsets(0, 5, 9))
    described.partitions.append(offsets(0, 1, 2).model_copy(update={"topic": "audit"}))
    assert topics_of(described) == ["audit", "orders"]


def stuck(partition: int, key_hash: int, offset: int, running_s: float) -> StuckCallDescription:
    return StuckCallDescription(
        topic="orders",
        partition=partition,
        key_hash=key_hash,
        offset=offset,
        running_s=running_s,
        reported_at=NOW,
        report_age_s=2.0,
        running_for_s=running_s + 2.0,
        summary=f"slice orders[{partition}] key hash {key_hash} held by a stuck call at "
        f"offset {offset} for {running_s + 2.0:.1f} s",
    )


def test_stuck_calls_are_counted_per_member_and_marked_on_their_partitions() -> None:
    described = description(offsets(0, 5, 9))
    holder = described.members[1]  # m-a, owning half of partition 0 and all of partition 1
    holder.stuck = [stuck(0, 12345, 7, 40.0), stuck(1, HASH_MAX, 2_500, 4.5), stuck(0, 9, 8, 95)]
    page = page_of(described)

    assert page.stuck_calls == 3
    assert [(row.member_id, row.stuck_calls) for row in page.members] == [("m-a", 3), ("m-b", 0)]
    first, second = page.partitions
    assert [(m.key_hash, m.offset, m.running_for_s) for m in first.stuck] == [
        (9, 8, 97.0),
        (12345, 7, 42.0),
    ], "longest running first"
    assert {m.member_id for m in first.stuck} == {"m-a"}
    assert first.stuck[0].colour == page.members[0].colour
    assert first.stuck[1].at == 12345 / 2**63
    (last,) = second.stuck
    assert last.at == 1 - 0.003, "the last hash's mark stays inside the bar"

    html = templates.get_template("group.html").render(page=page)
    assert 'id="stuck-warning">3 stuck calls still running' in html
    assert '<span class="badge stuck-badge">3 stuck</span>' in html
    assert html.count('<li class="stuck-call"') == 3
    assert f'data-member="m-a" data-key-hash="{HASH_MAX}" data-offset="2500"' in html, (
        "the call on partition 1"
    )
    words = " ".join(html.split())
    assert (
        'key hash <strong class="key-hash">12345</strong> held by a stuck call at offset '
        '<strong class="offset">7</strong> for <strong class="running-for">42.0 s</strong>'
    ) in words
    assert "<title>slice orders[0] key hash 9 held by a stuck call at offset 8 for 97.0 s" in html


def test_a_group_without_stuck_calls_shows_no_warning() -> None:
    page = page_of(description(offsets(0, 5, 9)))
    assert page.stuck_calls == 0
    assert all(not view.stuck for view in page.partitions)
    html = templates.get_template("group.html").render(page=page)
    assert "stuck-warning" not in html and "stuck-call" not in html
