"""Bearer tokens with two scopes. Tokens are compared in constant time against every
configured token (no early exit), and never logged."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Literal

from fastapi import Request

from coordinator.core.quotas import group_scope
from coordinator.errors import Forbidden, Unauthorized
from coordinator.settings import Settings


@dataclass(frozen=True)
class Principal:
    scope: Literal["admin", "client"]
    group_prefixes: tuple[str, ...] = field(default=())

    def may_use_group(self, group_id: str) -> bool:
        if self.scope == "admin" or not self.group_prefixes:
            return True
        return any(group_id.startswith(prefix) for prefix in self.group_prefixes)

    def group_scope(self, group_id: str) -> str:
        """The tenant whose group cap a new ``group_id`` counts against."""
        return group_scope(self.group_prefixes, group_id)


_LOCAL_ADMIN = Principal("admin")


def _bearer(header: str) -> bytes:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token")
    return token.strip().encode()


def authenticate(request: Request) -> Principal:
    return principal_of(request.app.state.settings, request.headers.get("authorization", ""))


def principal_of(settings: Settings, authorization: str) -> Principal:
    """Who an ``Authorization`` header value (empty when absent) speaks for."""
    if not settings.auth_enabled:
        return _LOCAL_ADMIN
    presented = _bearer(authorization)
    found: Principal | None = None
    for secret in settings.admin_tokens:
        if hmac.compare_digest(presented, secret.get_secret_value().encode()):
            found = _LOCAL_ADMIN
    for client in settings.client_tokens:
        if hmac.compare_digest(presented, client.token.get_secret_value().encode()):
            found = found or Principal("client", tuple(client.group_prefixes))
    if found is None:
        raise Unauthorized("unknown bearer token")
    return found


def require_admin(request: Request) -> Principal:
    principal = authenticate(request)
    if principal.scope != "admin":
        raise Forbidden("this route needs an admin token")
    return principal


def require_group_access(request: Request, group_id: str) -> Principal:
    return check_group_access(authenticate(request), group_id)


def check_group_access(principal: Principal, group_id: str) -> Principal:
    if not principal.may_use_group(group_id):
        raise Forbidden(f"this token may not use group '{group_id}'")
    return principal


def may_read_group_metrics(settings: Settings, authorizations: list[str]) -> bool:
    """Whether ``/metrics`` may carry per-group series for this request: always when the
    operator opted in; otherwise only for a scraper presenting a metrics token. A request
    presenting anything else is refused rather than silently given less."""
    if not authorizations:
        return settings.metrics_group_labels
    if len(authorizations) > 1:
        raise Unauthorized("more than one Authorization header")
    presented = _bearer(authorizations[0])
    found = False
    for secret in settings.metrics_tokens:
        found |= hmac.compare_digest(presented, secret.get_secret_value().encode())
    if not found:
        raise Unauthorized("unknown metrics token")
    return True
