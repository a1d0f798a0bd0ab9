"""Client-side errors: one root, one class per error name the coordinator sends (docs/api.md,
names from ``client/protocol/error_names.py``).

Callers decide with ``isinstance`` and the ``retriable`` class attribute, never by matching
message text; ``error_for_name`` is the single place that maps a problem document's
``error`` field to a class.
"""

from __future__ import annotations

from typing import Any

from client.protocol import error_names as names


class KeyrangeClientError(Exception):
    """Root of every error the Keyrange client raises."""

    error: str = "UNKNOWN_ERROR"
    retriable: bool = False

    def __init__(self, detail: str, *, status: int | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.extra = extra


class CoordinatorUnavailable(KeyrangeClientError):
    """The coordinator could not be reached or answered 5xx; the call may succeed later."""

    error = names.SERVICE_UNAVAILABLE
    retriable = True


class InvalidRequest(KeyrangeClientError):
    error = names.INVALID_REQUEST


class Unauthorized(KeyrangeClientError):
    error = names.UNAUTHORIZED


class Forbidden(KeyrangeClientError):
    error = names.FORBIDDEN


class GroupIdNotFound(KeyrangeClientError):
    error = names.GROUP_ID_NOT_FOUND


class FencedMemberEpoch(KeyrangeClientError):
    """The member's epoch is stale: refresh it with a heartbeat before committing again."""

    error = names.FENCED_MEMBER_EPOCH


class UnknownMemberId(KeyrangeClientError):
    """The coordinator does not know this member (session expired, or standalone commit
    while the group has live members); the member must rejoin with epoch 0."""

    error = names.UNKNOWN_MEMBER_ID


class IndividualCommitNotAllowed(KeyrangeClientError):
    error = names.INDIVIDUAL_COMMIT_NOT_ALLOWED


class EndpointNotAllowed(KeyrangeClientError):
    """The query endpoint this member advertises is on a host the coordinator's operator did
    not allow (``KEYRANGE_ALLOWED_ENDPOINT_HOSTS``); the member does not join."""

    error = names.ENDPOINT_NOT_ALLOWED


class PathNotFound(KeyrangeClientError):
    """The coordinator serves nothing at the path asked for: ``coordinator_url`` names the
    wrong place (a prefix too many or missing), not a missing group."""

    error = names.NOT_FOUND


class GroupNotEmpty(KeyrangeClientError):
    error = names.GROUP_NOT_EMPTY


class GroupMaxSizeReached(KeyrangeClientError):
    """The group has ``max_members_per_group`` live members; this member may not join until
    one leaves (as Kafka's ``GROUP_MAX_SIZE_REACHED``, not retried)."""

    error = names.GROUP_MAX_SIZE_REACHED


class GroupMaxPartitionsReached(KeyrangeClientError):
    """The group has offsets stored for ``max_partitions_per_group`` partitions; a commit
    naming further partitions is refused whole."""

    error = names.GROUP_MAX_PARTITIONS_REACHED


class MaxGroupsReached(KeyrangeClientError):
    """The token's group prefix (or the coordinator) holds ``max_groups_per_prefix`` groups;
    no new group is created until one is deleted or expires."""

    error = names.MAX_GROUPS_REACHED


class OffsetOutOfRange(KeyrangeClientError):
    """An offset outside a partition's log: from the coordinator, an admin reset past the log
    end; from the SDK itself, a read position outside the log with ``auto_offset_reset="none"``
    (as Kafka's consumer raises ``OffsetOutOfRangeException``)."""

    error = names.OFFSET_OUT_OF_RANGE


class UnknownTopicOrPartition(KeyrangeClientError):
    error = names.UNKNOWN_TOPIC_OR_PARTITION


class IndividualCommitTooOld(KeyrangeClientError):
    """Per-partition commit outcome: everything sent was already below the stable offset."""

    error = names.INDIVIDUAL_COMMIT_TOO_OLD


class MaxIndividualCommitReached(KeyrangeClientError):
    """Per-partition commit outcome: the partition holds too many IC ranges; the coordinator
    rebalances the group, and committing again later (after a watermark advance) succeeds."""

    error = names.MAX_INDIVIDUAL_COMMIT_REACHED
    retriable = True


class ConsumerStopped(KeyrangeClientError):
    """The consumer is not started, or was stopped (raised by the SDK itself, never by the
    coordinator)."""

    error = "CONSUMER_STOPPED"


class NoOffsetForPartition(KeyrangeClientError):
    """The group never committed a partition the consumer was given, and its
    ``auto_offset_reset`` is ``"none"`` (raised by the SDK itself, as Kafka's consumer raises
    ``NoOffsetForPartitionException``)."""

    error = "NO_OFFSET_FOR_PARTITION"


# Every name the coordinator sends (client/protocol/error_names.py), and its class here; a 500
# is a coordinator fault that may pass, so it retries like any other 5xx.
ERROR_CLASSES: dict[str, type[KeyrangeClientError]] = {
    **{
        cls.error: cls
        for cls in (
            CoordinatorUnavailable,
            InvalidRequest,
            Unauthorized,
            Forbidden,
            GroupIdNotFound,
            PathNotFound,
            FencedMemberEpoch,
            UnknownMemberId,
            IndividualCommitNotAllowed,
            GroupNotEmpty,
            EndpointNotAllowed,
            GroupMaxSizeReached,
            GroupMaxPartitionsReached,
            MaxGroupsReached,
            OffsetOutOfRange,
            UnknownTopicOrPartition,
            IndividualCommitTooOld,
            MaxIndividualCommitReached,
        )
    },
    names.INTERNAL_ERROR: CoordinatorUnavailable,
}


def error_for_name(name: str | None, status: int) -> type[KeyrangeClientError]:
    """The class for a problem document's ``error`` name; unknown names fall back by status
    so a newer coordinator's errors still classify sensibly (5xx stays retriable)."""
    if name is not None and name in ERROR_CLASSES:
        return ERROR_CLASSES[name]
    if status >= 500:
        return CoordinatorUnavailable
    return KeyrangeClientError
