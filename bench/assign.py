"""Speed and quality of every assignor (docs/design.md §6), pure computation, no services.

Scenarios: 10, 100, 1,000 and 5,000 members over 4 topics x 64 partitions, and 1,000 members
on one topic of 16 partitions; every member subscribes to every topic and every topic accepts
range fetch, so larger groups share partitions by key range.

Per scenario and assignor:
- ``assign_ms``: p50 time of one rebalance as the coordinator runs it (members carry their
  previous target as ``owned``, one member has just left). The baseline, measured in the same
  run, is ``output_floor_ms``: building the same result from a precomputed list of slices,
  the least any assignor must spend; ``assign_over_output_floor`` is the ratio.
- ``balance``: largest ``max - min`` load among members of the same subscription, in
  partitions (1.0 = one whole partition).
- ``moved_fraction_on_leave`` / ``moved_fraction_on_join``: share of all assigned hash space
  whose owner changed when the middle member (in member order) leaves, or when a member whose
  id sorts in the middle joins, starting from a settled assignment.
- ``moved_fraction_minimum``: what must move at least: on leave the leaver's share; on join
  the joiner's fair share ``1 / members`` (an assignor that seats the joiner with the smallest
  slices can move a little less than that).
- ``max_ranges_per_partition``: most key ranges one member holds on one partition after the
  join (sticky-join hands a joiner tiles from several members, so it holds a few ranges).
- ``reconcile_member_ms``: p50 time of one heartbeat's hand-off decision
  (``reconcile_member``) in the settled round-robin group of that size.

Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench.heartbeat import measure_heartbeats
from coordinator.core.assignment import (
    GroupAssignment,
    GroupSpec,
    MemberSpec,
    TopicSpec,
    balance,
    hash_count,
    moved_fraction,
    ranges_by_partition,
)
from coordinator.core.assignors import ASSIGNORS, Assignor
from coordinator.core.assignors.base import AssignmentBuilder
from coordinator.core.reconcile import MemberHolding, reconcile_member

SCENARIOS: dict[str, tuple[int, int, int]] = {
    # name: (members, topics, partitions per topic)
    "10": (10, 4, 64),
    "100": (100, 4, 64),
    "1000": (1000, 4, 64),
    "5000": (5000, 4, 64),
    "1000_on_16_partitions": (1000, 1, 16),
}
# Enough repeats for a stable median without the 5,000-member case taking minutes.
REPEATS = {10: 21, 100: 21, 1000: 7, 5000: 5}


def build_group(members: int, topics: int, partitions: int) -> GroupSpec:
    topic_specs = [TopicSpec(f"topic-{index}", partitions, True) for index in range(topics)]
    subscription = frozenset(topic.name for topic in topic_specs)
    return GroupSpec.of(
        [MemberSpec(f"member-{index:05d}", subscription) for index in range(members)], topic_specs
    )


def with_previous(
    group: GroupSpec, previous: GroupAssignment, members: list[MemberSpec]
) -> GroupSpec:
    """The group as the coordinator hands it to the assignor: each member's previous target
    as what it owns."""
    return GroupSpec(
        {
            member.member_id: replace(member, owned=previous.get(member.member_id, ()))
            for member in members
        },
        group.topics,
        group.accept_individual_commit,
    )


def median_ms(run: Callable[[], object], repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def output_floor_ms(assignment: GroupAssignment, repeats: int) -> float:
    """Time to build ``assignment`` from a flat list of its slices: the shared floor."""
    flat = [
        (member, piece.topic, piece.partition, piece.keys)
        for member, slices in assignment.items()
        for piece in slices
    ]

    def rebuild() -> GroupAssignment:
        builder = AssignmentBuilder(assignment)
        for member, topic, partition, keys in flat:
            builder.add(member, topic, partition, keys)
        return builder.build()

    return median_ms(rebuild, repeats)


def reconcile_member_ms(assignment: GroupAssignment, repeats: int) -> float:
    holdings = {member: MemberHolding(slices, slices, 1) for member, slices in assignment.items()}
    member = sorted(assignment)[len(assignment) // 2]
    return median_ms(lambda: reconcile_member(member, holdings, assignment[member]), repeats)


def measure(assignor: Assignor, group: GroupSpec, repeats: int) -> dict[str, float]:
    members = list(group.ordered_members)
    settled = assignor.assign(with_previous(group, assignor.assign(group), members))
    total = sum(hash_count(slices) for slices in settled.values())

    leaver = members[len(members) // 2]
    after_leave_group = with_previous(group, settled, [m for m in members if m is not leaver])
    after_leave = assignor.assign(after_leave_group)

    joiner = MemberSpec(f"{leaver.member_id}+", leaver.subscribed_topics)
    after_join = assignor.assign(with_previous(group, settled, [*members, joiner]))

    assign_ms = median_ms(lambda: assignor.assign(after_leave_group), repeats)
    return {
        "assign_ms": assign_ms,
        "balance": balance(after_leave, after_leave_group),
        "moved_fraction_on_leave": moved_fraction(settled, after_leave),
        "moved_fraction_on_join": moved_fraction(settled, after_join),
        "leaver_share": hash_count(settled[leaver.member_id]) / total,
        "max_ranges_per_partition": max(
            len(ranges)
            for slices in after_join.values()
            for ranges in ranges_by_partition(slices).values()
        ),
    }


def run() -> dict[str, Any]:
    result: dict[str, Any] = {
        key: {}
        for key in (
            "assign_ms",
            "output_floor_ms",
            "assign_over_output_floor",
            "balance",
            "moved_fraction_on_leave",
            "moved_fraction_on_join",
            "moved_fraction_minimum",
            "max_ranges_per_partition",
            "reconcile_member_ms",
        )
    }
    for scenario, (members, topics, partitions) in SCENARIOS.items():
        group = build_group(members, topics, partitions)
        repeats = REPEATS[members]
        round_robin = ASSIGNORS["round-robin"].assign(group)
        floor = output_floor_ms(round_robin, repeats)
        result["output_floor_ms"][scenario] = round(floor, 3)
        result["reconcile_member_ms"][scenario] = round(
            reconcile_member_ms(round_robin, repeats), 3
        )
        per_assignor = {
            name: measure(assignor, group, repeats) for name, assignor in ASSIGNORS.items()
        }
        for name, measured in per_assignor.items():
            print(f"{scenario:>22} {name:<12} " + json.dumps(measured), flush=True)
        for key in ("assign_ms", "balance", "moved_fraction_on_leave", "moved_fraction_on_join"):
            result[key][scenario] = {
                name: round(measured[key], 6) for name, measured in per_assignor.items()
            }
        result["assign_over_output_floor"][scenario] = {
            name: round(measured["assign_ms"] / floor, 2) for name, measured in per_assignor.items()
        }
        result["max_ranges_per_partition"][scenario] = {
            name: int(measured["max_ranges_per_partition"])
            for name, measured in per_assignor.items()
        }
        result["moved_fraction_minimum"][scenario] = {
            "leave": {
                name: round(measured["leaver_share"], 6) for name, measured in per_assignor.items()
            },
            "join": round(1 / (members + 1), 6),
        }
    timings_5000 = result["assign_ms"]["5000"]
    worst = max(timings_5000, key=timings_5000.__getitem__)
    result["assign_ms_5000"] = {
        "round-robin": timings_5000["round-robin"],
        "worst": {"assignor": worst, "ms": timings_5000[worst]},
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="Assignor speed and quality, then heartbeat load.")
    parser.add_argument(
        "--heartbeat-duration",
        type=float,
        default=60.0,
        help="measured seconds of the 2,000-member heartbeat load; 0 skips it",
    )
    args = parser.parse_args()
    result = run()
    if args.heartbeat_duration > 0:
        result.update(
            measure_heartbeats(
                duration_s=args.heartbeat_duration,
                groups=20,
                members_per_group=100,
                partitions=16,
                connections=32,
            )
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
