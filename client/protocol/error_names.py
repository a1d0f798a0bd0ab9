"""The error names of the protocol (docs/design.md §3, docs/api.md).

A problem document's ``error`` field, and a commit reply's per-partition ``error``. The
coordinator's errors and the client's error classes take their names from here, and
``tests/test_protocol.py`` holds both sides to this list.
"""

from __future__ import annotations

# Problem documents: a whole request refused.
INVALID_REQUEST = "INVALID_REQUEST"
UNAUTHORIZED = "UNAUTHORIZED"
FORBIDDEN = "FORBIDDEN"
GROUP_ID_NOT_FOUND = "GROUP_ID_NOT_FOUND"
FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"
UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
INDIVIDUAL_COMMIT_NOT_ALLOWED = "INDIVIDUAL_COMMIT_NOT_ALLOWED"
GROUP_NOT_EMPTY = "GROUP_NOT_EMPTY"
# Kafka's names: an offset outside the partition's log, a partition the topic does not have.
OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
INTERNAL_ERROR = "INTERNAL_ERROR"
# A path the coordinator serves nothing at (a wrong URL or prefix); never a group or topic.
NOT_FOUND = "NOT_FOUND"
# The per-tenant caps (docs/quotas.md); GROUP_MAX_SIZE_REACHED is Kafka's name for the first.
GROUP_MAX_SIZE_REACHED = "GROUP_MAX_SIZE_REACHED"
GROUP_MAX_PARTITIONS_REACHED = "GROUP_MAX_PARTITIONS_REACHED"
MAX_GROUPS_REACHED = "MAX_GROUPS_REACHED"
# A member advertising a query endpoint whose host the operator's allow-list does not name
# (``KEYRANGE_ALLOWED_ENDPOINT_HOSTS``, docs/security.md).
ENDPOINT_NOT_ALLOWED = "ENDPOINT_NOT_ALLOWED"

# A commit's per-partition outcomes: the request was applied, this partition's part was not
# (or not all of it).
INDIVIDUAL_COMMIT_TOO_OLD = "INDIVIDUAL_COMMIT_TOO_OLD"
MAX_INDIVIDUAL_COMMIT_REACHED = "MAX_INDIVIDUAL_COMMIT_REACHED"

# Named by docs/design.md §3 after the KIP, for a broker that refuses a range fetch. Keyrange's
# coordinator never sends them: a topic whose ``accept.range.fetch`` is off, or a member whose
# ``allow.individual.commit`` is off, is simply given whole partitions.
TOPIC_RANGE_FETCH_NOT_ALLOWED = "TOPIC_RANGE_FETCH_NOT_ALLOWED"
CONSUMER_RANGE_FETCH_NOT_ACCEPTED = "CONSUMER_RANGE_FETCH_NOT_ACCEPTED"

PROBLEM_ERRORS = frozenset(
    {
        INVALID_REQUEST,
        UNAUTHORIZED,
        FORBIDDEN,
        GROUP_ID_NOT_FOUND,
        FENCED_MEMBER_EPOCH,
        UNKNOWN_MEMBER_ID,
        INDIVIDUAL_COMMIT_NOT_ALLOWED,
        GROUP_NOT_EMPTY,
        OFFSET_OUT_OF_RANGE,
        UNKNOWN_TOPIC_OR_PARTITION,
        SERVICE_UNAVAILABLE,
        INTERNAL_ERROR,
        NOT_FOUND,
        GROUP_MAX_SIZE_REACHED,
        GROUP_MAX_PARTITIONS_REACHED,
        MAX_GROUPS_REACHED,
        ENDPOINT_NOT_ALLOWED,
    }
)
PARTITION_ERRORS = frozenset({INDIVIDUAL_COMMIT_TOO_OLD, MAX_INDIVIDUAL_COMMIT_REACHED})
NEVER_SENT = frozenset({TOPIC_RANGE_FETCH_NOT_ALLOWED, CONSUMER_RANGE_FETCH_NOT_ACCEPTED})
