"""Client-side errors: one root, one class per coordinator error name (docs/api.md).

Callers decide with ``isinstance`` and the ``retriable`` class attribute, never by matching
message text; ``error_for_name`` is the single place that maps a problem document's
``error`` field to a class.
"""

from __future__ import annotations

from typing import Any


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

    error = "SERVICE_UNAVAILABLE"
    retriable = True


class InvalidRequest(KeyrangeClientError):
    error = "INVALID_REQUEST"


class Unauthorized(KeyrangeClientError):
    error = "UNAUTHORIZED"


class Forbidden(KeyrangeClientError):
    error = "FORBIDDEN"


class GroupIdNotFound(KeyrangeClientError):
    error = "GROUP_ID_NOT_FOUND"


class FencedMemberEpoch(KeyrangeClientError):
    """The member's epoch is stale: refresh it with a heartbeat before committing again."""

    error = "FENCED_MEMBER_EPOCH"


class UnknownMemberId(KeyrangeClientError):
    """The coordinator does not know this member (session expired, or standalone commit
    while the group has live members); the member must rejoin with epoch 0."""

    error = "UNKNOWN_MEMBER_ID"


class IndividualCommitNotAllowed(KeyrangeClientError):
    error = "INDIVIDUAL_COMMIT_NOT_ALLOWED"


class GroupNotEmpty(KeyrangeClientError):
    error = "GROUP_NOT_EMPTY"


class TopicRangeFetchNotAllowed(KeyrangeClientError):
    error = "TOPIC_RANGE_FETCH_NOT_ALLOWED"


class ConsumerRangeFetchNotAccepted(KeyrangeClientError):
    error = "CONSUMER_RANGE_FETCH_NOT_ACCEPTED"


class IndividualCommitTooOld(KeyrangeClientError):
    """Per-partition commit outcome: everything sent was already below the stable offset."""

    error = "INDIVIDUAL_COMMIT_TOO_OLD"


class MaxIndividualCommitReached(KeyrangeClientError):
    """Per-partition commit outcome: the partition holds too many IC ranges; the coordinator
    rebalances the group, and committing again later (after a watermark advance) succeeds."""

    error = "MAX_INDIVIDUAL_COMMIT_REACHED"
    retriable = True


class ConsumerStopped(KeyrangeClientError):
    """The consumer is not started, or was stopped (raised by the SDK itself, never by the
    coordinator)."""

    error = "CONSUMER_STOPPED"


_BY_NAME: dict[str, type[KeyrangeClientError]] = {
    cls.error: cls
    for cls in (
        CoordinatorUnavailable,
        InvalidRequest,
        Unauthorized,
        Forbidden,
        GroupIdNotFound,
        FencedMemberEpoch,
        UnknownMemberId,
        IndividualCommitNotAllowed,
        GroupNotEmpty,
        TopicRangeFetchNotAllowed,
        ConsumerRangeFetchNotAccepted,
        IndividualCommitTooOld,
        MaxIndividualCommitReached,
    )
}


def error_for_name(name: str | None, status: int) -> type[KeyrangeClientError]:
    """The class for a problem document's ``error`` name; unknown names fall back by status
    so a newer coordinator's errors still classify sensibly (5xx stays retriable)."""
    if name is not None and name in _BY_NAME:
        return _BY_NAME[name]
    if status >= 500:
        return CoordinatorUnavailable
    return KeyrangeClientError
