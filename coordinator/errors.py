"""One error root for the coordinator: every failure a caller can see has an error name
(docs/design.md §3) and an HTTP status, and one handler renders them all as RFC 9457
problem documents."""

from __future__ import annotations

from typing import Any

from client.protocol import error_names as names


class KeyrangeError(Exception):
    status: int = 500
    error: str = names.INTERNAL_ERROR
    title: str = "Internal error"
    retriable: bool = False

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class InvalidRequest(KeyrangeError):
    status = 400
    error = names.INVALID_REQUEST
    title = "Invalid request"


class PayloadTooLarge(InvalidRequest):
    status = 413
    title = "Request body too large"


class Unauthorized(KeyrangeError):
    status = 401
    error = names.UNAUTHORIZED
    title = "Unauthorized"


class Forbidden(KeyrangeError):
    status = 403
    error = names.FORBIDDEN
    title = "Forbidden"


class EndpointNotAllowed(KeyrangeError):
    status = 403
    error = names.ENDPOINT_NOT_ALLOWED
    title = "Endpoint not allowed"


class PathNotFound(KeyrangeError):
    """No route at this path: told apart from a group or topic that does not exist, so a
    client pointed at the wrong URL (or a proxy's prefix) is not told the group is missing."""

    status = 404
    error = names.NOT_FOUND
    title = "Not found"


class GroupIdNotFound(KeyrangeError):
    status = 404
    error = names.GROUP_ID_NOT_FOUND
    title = "Group not found"


class FencedMemberEpoch(KeyrangeError):
    status = 409
    error = names.FENCED_MEMBER_EPOCH
    title = "Fenced member epoch"


class UnknownMemberId(KeyrangeError):
    status = 409
    error = names.UNKNOWN_MEMBER_ID
    title = "Unknown member id"


class IndividualCommitNotAllowed(KeyrangeError):
    status = 409
    error = names.INDIVIDUAL_COMMIT_NOT_ALLOWED
    title = "Individual commit not allowed"


class GroupNotEmpty(KeyrangeError):
    status = 409
    error = names.GROUP_NOT_EMPTY
    title = "Group has live members"


class QuotaExceeded(KeyrangeError):
    """A per-tenant cap (docs/quotas.md). 409, not 429: the refusal follows from what is
    stored, so the same request is refused again until members leave, offsets are deleted
    or the operator raises the cap; backing off and retrying does not help."""

    status = 409
    # The cap's name in keyrange_quota_refusals_total.
    cap: str = ""


class GroupMaxSizeReached(QuotaExceeded):
    error = names.GROUP_MAX_SIZE_REACHED
    title = "Group has the most members allowed"
    cap = "members"


class GroupMaxPartitionsReached(QuotaExceeded):
    error = names.GROUP_MAX_PARTITIONS_REACHED
    title = "Group has offsets for the most partitions allowed"
    cap = "partitions"


class MaxGroupsReached(QuotaExceeded):
    error = names.MAX_GROUPS_REACHED
    title = "The most groups allowed exist"
    cap = "groups"


class OffsetOutOfRange(KeyrangeError):
    status = 409
    error = names.OFFSET_OUT_OF_RANGE
    title = "Offset outside the partition's log"


class UnknownTopicOrPartition(KeyrangeError):
    status = 404
    error = names.UNKNOWN_TOPIC_OR_PARTITION
    title = "Unknown topic or partition"


class ServiceUnavailable(KeyrangeError):
    status = 503
    error = names.SERVICE_UNAVAILABLE
    title = "Service unavailable"
    retriable = True
