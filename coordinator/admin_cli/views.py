"""The admin replies as tables, one function per reply shape. The key-range view is what only
Keyrange has: a partition's hash space [0, 2^63-1] split among members, with the gaps no one
owns, the way ``kafka-consumer-groups --describe --members --verbose`` lists assignments."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from client.protocol.keyspace import KeyRange
from coordinator.admin_cli.tables import Cell, table

HASH_SPACE = 2**63
_UNOWNED = "-"

Body = dict[str, Any]


def groups(body: Body) -> str:
    return table(
        ["GROUP", "STATE", "ASSIGNOR", "MEMBERS", "PARTITIONS", "CREATED"],
        [
            [
                g["group_id"],
                g["state"],
                g["assignor"],
                g["members"],
                g["partitions"],
                _time(g["created_at"]),
            ]
            for g in body["groups"]
        ],
    )


def group(body: Body) -> str:
    """Summary, partitions with offsets and lag, key-range owners, members."""
    header = table(
        ["GROUP", "STATE", "ASSIGNOR", "EPOCH", "MEMBERS", "REBALANCE"],
        [
            [
                body["group_id"],
                body["state"],
                body["assignor"],
                body["group_epoch"],
                len(body["members"]),
                body["rebalance_reason"] if body["rebalance_requested"] else None,
            ]
        ],
    )
    owned = _owned_ranges(body["members"])
    sections = [
        header,
        partitions(body["partitions"], owned.keys()),
        key_ranges(owned),
        members(body["members"]),
    ]
    # Only when there are any, so a healthy group's printout stays as it always was.
    if any(member.get("stuck") for member in body["members"]):
        sections.append(stuck_calls(body["members"]))
    return "\n\n".join(sections)


def offsets(body: Body) -> str:
    return partitions(body["partitions"], ())


def partitions(entries: list[Body], also: Iterable[tuple[str, int]]) -> str:
    """One row per partition with stored offsets, and one with "-" for each partition in
    ``also`` (owned by a member) that has none yet, as Kafka shows a partition never committed."""
    stored = {(e["topic"], e["partition"]): e for e in entries}
    rows: list[list[Cell]] = []
    for topic, partition in sorted(set(stored) | set(also)):
        entry = stored.get((topic, partition))
        if entry is None:
            rows.append([topic, partition, None, None, None, None, None, None, None])
            continue
        rows.append(
            [
                topic,
                partition,
                entry["stable_offset"],
                entry["high_watermark"],
                entry["lag"],
                len(entry["ranges"]),
                len(entry["watermarks"]),
                entry["ic_offsets"],
                _seconds(entry.get("oldest_unprocessed_age_seconds")),
            ]
        )
    return table(
        [
            "TOPIC",
            "PARTITION",
            "STABLE-OFFSET",
            "HIGH-WATERMARK",
            "LAG",
            "IC-RANGES",
            "WATERMARK-PIECES",
            "IC-OFFSETS",
            "OLDEST-UNPROCESSED-S",
        ],
        rows,
    )


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


OwnedRanges = dict[tuple[str, int], list[tuple[int, int, Body]]]


def _owned_ranges(member_list: list[Body]) -> OwnedRanges:
    owned: OwnedRanges = defaultdict(list)
    for member in member_list:
        for piece in member["owned"]:
            for start, end in piece["ranges"]:
                owned[(piece["topic"], piece["partition"])].append((start, end, member))
    return owned


def key_ranges(owned: OwnedRanges) -> str:
    """Each partition's key ranges in hash order with their owner; a gap no member owns is a
    row of its own, so the rows of a partition always cover its whole hash space."""
    rows: list[list[Cell]] = []
    for (topic, partition), ranges in sorted(owned.items()):
        position = 0
        for start, end, member in sorted(ranges, key=lambda item: item[0]):
            if start > position:
                rows.append(_range_row(topic, partition, position, start - 1, None))
            rows.append(_range_row(topic, partition, start, end, member))
            position = max(position, end + 1)
        if position < HASH_SPACE:
            rows.append(_range_row(topic, partition, position, HASH_SPACE - 1, None))
    return table(
        ["TOPIC", "PARTITION", "KEY-RANGE", "SHARE", "MEMBER-ID", "CLIENT-ID", "HOST"], rows
    )


def key_range_text(start: int, end: int) -> str:
    """The closed hash range as the client's logs and the console write it, ``[start, end]``."""
    return str(KeyRange(start, end))


def _range_row(topic: str, partition: int, start: int, end: int, member: Body | None) -> list[Cell]:
    share = f"{100 * (end - start + 1) / HASH_SPACE:.1f}%"
    if member is None:
        return [topic, partition, key_range_text(start, end), share, _UNOWNED, None, None]
    return [
        topic,
        partition,
        key_range_text(start, end),
        share,
        member["member_id"],
        member["client_id"],
        member["client_host"],
    ]


def members(member_list: list[Body]) -> str:
    return table(
        ["MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "EPOCH", "LAST-HEARTBEAT", "#PARTITIONS"],
        [
            [
                m["member_id"],
                m["instance_id"],
                m["client_id"],
                m["client_host"],
                m["member_epoch"],
                _time(m["last_heartbeat"]),
                len({(piece["topic"], piece["partition"]) for piece in m["owned"]}),
            ]
            for m in member_list
        ],
    )


def stuck_calls(member_list: list[Body]) -> str:
    """Each call still running on a key of a slice its member was asked to give up, holding
    that slice (docs/operations.md, "Stuck calls"): where the member runs, which key, which
    record, and how long, aged from the member's last report."""
    return table(
        [
            "MEMBER-ID",
            "CLIENT-ID",
            "HOST",
            "TOPIC",
            "PARTITION",
            "KEY-HASH",
            "OFFSET",
            "RUNNING-FOR-S",
            "REPORT-AGE-S",
        ],
        [
            [
                m["member_id"],
                m["client_id"],
                m["client_host"],
                call["topic"],
                call["partition"],
                call["key_hash"],
                call["offset"],
                round(call["running_for_s"], 1),
                round(call["report_age_s"], 1),
            ]
            for m in member_list
            for call in m.get("stuck", [])
        ],
    )


def reset(body: Body) -> str:
    return table(
        ["TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET", "HIGH-WATERMARK", "NEW-LAG"],
        [
            [
                e["topic"],
                e["partition"],
                e["previous_offset"],
                e["stable_offset"],
                e["high_watermark"],
                e["lag"],
            ]
            for e in body["partitions"]
        ],
    )


def topic_config(body: Body) -> str:
    return table(
        ["TOPIC", "ACCEPT-RANGE-FETCH", "SET-FOR-THE-TOPIC"],
        [[body["topic"], body["accept_range_fetch"], body["explicit"]]],
    )


def config(body: Body) -> str:
    return table(["SWITCH", "VALUE"], [[name, value] for name, value in body.items()])


def deleted(body: Body) -> str:
    return table(["DELETED"], [[body["deleted"]]])


def rebalanced(body: Body) -> str:
    return table(["GROUP", "EPOCH"], [[body["group_id"], body["group_epoch"]]])


def removed(body: Body) -> str:
    return table(
        ["GROUP", "REMOVED-MEMBER", "EPOCH"],
        [[body["group_id"], body["member_id"], body["group_epoch"]]],
    )


def _time(value: str | None) -> str | None:
    """An API time to the second, as a column can hold it: 2026-11-25 03:20:14+00:00."""
    if value is None:
        return None
    return datetime.fromisoformat(value).isoformat(sep=" ", timespec="seconds")
