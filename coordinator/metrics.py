"""Prometheus metrics, named in docs/operations.md.

Two registries per process. The default one carries no tenant data (no group id, topic or
lag per partition) and ``/metrics`` serves it to anyone; ``TENANT_REGISTRY`` holds the
per-group series, served only when the operator opts in or the scraper presents a metrics
token (docs/quotas.md).
"""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TENANT_REGISTRY = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "keyrange_http_requests_total", "HTTP requests served", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "keyrange_http_request_duration_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
COMMITS = Counter("keyrange_commits_total", "Commit requests applied")
COMMIT_BATCH_SIZE = Histogram(
    "keyrange_commit_batch_requests",
    "Commit requests applied in one database transaction",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
COMMITS_RERUN_ALONE = Counter(
    "keyrange_commit_requests_rerun_alone_total",
    "Commit requests a batch could not decide, or lost with its failed transaction, re-run "
    "in a transaction of their own",
)
COMMITTED_PARTITIONS = Counter(
    "keyrange_committed_partitions_total", "Partition entries of applied commits", ["outcome"]
)
STABLE_OFFSET_ADVANCES = Counter(
    "keyrange_stable_offset_advances_total", "Commits that moved a stable offset forward"
)
IC_RANGES_STORED = Gauge(
    "keyrange_ic_ranges_stored", "Individual-commit ranges stored over all groups and partitions"
)
HELD_HEARTBEATS = Counter(
    "keyrange_heartbeats_held_total",
    "Heartbeats answered after waiting: 'changed' when a change for the member ended the wait, "
    "'waited' when the member's interval ran out",
    ["outcome"],
)
HEARTBEATS_WAITING = Gauge(
    "keyrange_heartbeats_waiting", "Heartbeats of members with nothing to do, waiting for a change"
)
REBALANCES = Counter("keyrange_rebalances_total", "Target assignments computed", ["reason"])
HASH_SPACE_MOVED = Histogram(
    "keyrange_rebalance_moved_partitions",
    "Hash space that changed owner in one rebalance, in partitions",
    buckets=(0, 0.01, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 64, 256),
)
GROUPS = Gauge("keyrange_groups", "Groups stored, with or without members")
LIVE_MEMBERS = Gauge("keyrange_live_members", "Live members over all groups")
GROUPS_EXPIRED = Counter(
    "keyrange_groups_expired_total",
    "Groups deleted after offsets_retention_minutes without members or commits",
)
STUCK_CALLS = Gauge(
    "keyrange_stuck_calls",
    "Calls live members report stuck over all groups: still running on keys of slices their "
    "members were asked to give up, holding those slices (docs/operations.md)",
)
STUCK_CALL_MAX_SECONDS = Gauge(
    "keyrange_stuck_call_max_seconds",
    "How long the longest stuck call over all groups has been running (0: none)",
)
QUOTA_REFUSALS = Counter(
    "keyrange_quota_refusals_total", "Requests refused by a per-tenant cap", ["cap"]
)

GROUP_MEMBERS = Gauge(
    "keyrange_group_members", "Live members", ["group_id"], registry=TENANT_REGISTRY
)
MEMBER_LOAD = Gauge(
    "keyrange_group_member_load",
    "Hash space per member, in partitions",
    ["group_id", "bound"],
    registry=TENANT_REGISTRY,
)
PARTITION_LAG = Gauge(
    "keyrange_partition_lag",
    "High watermark minus stable offset",
    ["group_id", "topic", "partition"],
    registry=TENANT_REGISTRY,
)
PARTITION_OLDEST_UNPROCESSED_AGE = Gauge(
    "keyrange_partition_oldest_unprocessed_age_seconds",
    "Seconds since the record at the stable offset was written (0: nothing unprocessed)",
    ["group_id", "topic", "partition"],
    registry=TENANT_REGISTRY,
)
GROUP_DESIRED_MEMBERS = Gauge(
    "keyrange_group_desired_members",
    "Members the group's lag asks for at its measured processing rate (docs/scaling.md), "
    "set each time GET /v1/admin/groups/{group}/scaling computes it",
    ["group_id"],
    registry=TENANT_REGISTRY,
)
MEMBER_STUCK_CALLS = Gauge(
    "keyrange_member_stuck_calls",
    "Calls the group's live members report stuck, each holding its key's slice",
    ["group_id"],
    registry=TENANT_REGISTRY,
)
MEMBER_STUCK_CALL_MAX_SECONDS = Gauge(
    "keyrange_member_stuck_call_max_seconds",
    "How long the group's longest stuck call has been running: as its member last reported, "
    "plus the report's age (0: none)",
    ["group_id"],
    registry=TENANT_REGISTRY,
)
_GROUP_SERIES = (
    GROUP_MEMBERS,
    MEMBER_LOAD,
    PARTITION_LAG,
    PARTITION_OLDEST_UNPROCESSED_AGE,
    GROUP_DESIRED_MEMBERS,
    MEMBER_STUCK_CALLS,
    MEMBER_STUCK_CALL_MAX_SECONDS,
)


def forget_groups(group_ids: Collection[str]) -> None:
    """Drop every series of these groups, as when they are deleted."""
    for group_id in group_ids:
        for gauge in _GROUP_SERIES:
            gauge.remove_by_labels({"group_id": group_id})


def groups_with_load() -> set[str]:
    """The groups this process exports a member load for."""
    return {
        sample.labels["group_id"] for family in MEMBER_LOAD.collect() for sample in family.samples
    }
