"""The describe tables from a reply holding what a live group rarely shows at a chosen moment:
a key range nobody owns, a partition owned before anything was committed for it, and a high
watermark not known."""

from __future__ import annotations

from coordinator.admin_cli import views

END = 2**63 - 1
QUARTER = 2**61


def member(member_id: str, *owned: tuple[int, list[list[int]]]) -> dict[str, object]:
    return {
        "member_id": member_id,
        "instance_id": None,
        "client_id": f"client-{member_id}",
        "client_host": "10.0.0.1",
        "member_epoch": 4,
        "last_heartbeat": "2026-11-25T03:29:16.123456+00:00",
        "owned": [
            {"topic": "orders", "partition": partition, "ranges": ranges}
            for partition, ranges in owned
        ],
    }


DESCRIPTION = {
    "group_id": "g",
    "state": "stable",
    "assignor": "round-robin",
    "group_epoch": 4,
    "rebalance_requested": False,
    "rebalance_reason": None,
    "members": [
        member("a", (0, [[0, QUARTER - 1]])),
        member("b", (0, [[2 * QUARTER, END]]), (1, [[0, END]])),
    ],
    "partitions": [
        {
            "topic": "orders",
            "partition": 0,
            "stable_offset": 7,
            "ranges": [[9, 9]],
            "watermarks": [],
            "ic_offsets": 1,
            "high_watermark": None,
            "lag": None,
        }
    ],
}


def sections() -> list[list[list[str]]]:
    return [
        [line.split() for line in block.splitlines()[1:]]
        for block in views.group(DESCRIPTION).split("\n\n")
    ]


def test_a_gap_in_the_key_space_is_a_row_owned_by_nobody() -> None:
    _, _, ranges, _ = sections()
    # A range is written [first, last] as the client's logs do: two words for split().
    assert [row[1:6] for row in ranges] == [
        ["0", "[0,", f"{QUARTER - 1}]", "25.0%", "a"],
        ["0", f"[{QUARTER},", f"{2 * QUARTER - 1}]", "25.0%", "-"],
        ["0", f"[{2 * QUARTER},", f"{END}]", "50.0%", "b"],
        ["1", "[0,", f"{END}]", "100.0%", "b"],
    ]


def test_an_owned_partition_without_offsets_and_an_unknown_watermark_show_a_dash() -> None:
    _, partitions, _, members = sections()
    assert partitions == [
        ["orders", "0", "7", "-", "-", "1", "0", "1", "-"],
        ["orders", "1", "-", "-", "-", "-", "-", "-", "-"],
    ]
    assert [(row[0], row[-1]) for row in members] == [("a", "1"), ("b", "2")]
    assert members[0][5:7] == ["2026-11-25", "03:29:16+00:00"]


def test_stuck_calls_are_a_table_of_their_own_naming_member_key_offset_and_age() -> None:
    holder = member("b", (0, [[2 * QUARTER, END]]))
    holder["stuck"] = [
        {
            "topic": "orders",
            "partition": 0,
            "key_hash": 2 * QUARTER + 9,
            "offset": 1234,
            "running_s": 70.0,
            "reported_at": "2026-11-25T03:29:16.123456+00:00",
            "report_age_s": 2.04,
            "running_for_s": 72.04,
            "summary": "slice orders[0] key hash … held by a stuck call at offset 1234 for 72.0 s",
        }
    ]
    printed = views.group({**DESCRIPTION, "members": [member("a"), holder]})
    *_, members, stuck = printed.split("\n\n")
    header, row = stuck.splitlines()
    assert header.split() == [
        "MEMBER-ID",
        "CLIENT-ID",
        "HOST",
        "TOPIC",
        "PARTITION",
        "KEY-HASH",
        "OFFSET",
        "RUNNING-FOR-S",
        "REPORT-AGE-S",
    ]
    assert row.split() == [
        "b",
        "client-b",
        "10.0.0.1",
        "orders",
        "0",
        str(2 * QUARTER + 9),
        "1234",
        "72.0",
        "2.0",
    ]
    assert len(members.splitlines()) == 3


def test_no_stuck_table_for_a_group_without_stuck_calls_or_from_an_older_coordinator() -> None:
    assert len(views.group(DESCRIPTION).split("\n\n")) == 4
    quiet = {**DESCRIPTION, "members": [{**member("a"), "stuck": []}]}
    assert len(views.group(quiet).split("\n\n")) == 4
