"""Bearer tokens with two scopes, checked at the edge (``admit``) before a request's body is
read. Tokens are compared in constant time against every configured token (no early exit),
and never logged."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from fastapi import Request
from starlette.types import Scope

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


# Routes anyone may call: the probes and metrics (they reveal no group data), the API's own
# description, the root (a redirect to the console), and the console's empty pages and assets
# (everything they show comes from fragments that need the admin scope). Every other path,
# unknown ones included, needs a token.
PUBLIC_PATHS = frozenset(
    {
        "/",
        "/livez",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/ui",
    }
)
_PUBLIC_PREFIXES = ("/docs/assets/", "/ui/static/", "/ui/groups/")
# The console's data, rendered from the admin API's own route functions.
_ADMIN_PREFIXES = ("/v1/admin/", "/ui/fragments/")
_ADMIN_PREFIX = "/v1/admin/"
_GROUP_PREFIX = "/v1/groups/"
_PRINCIPAL = "principal"


def admit(settings: Settings, scope: Scope) -> None:
    """Decide who the request speaks for and whether that may use its route, from the path
    and the headers alone, and keep the answer in the request's state.

    Runs ahead of everything else on every request, the commit fast path included, so a
    caller without the right token is refused before any byte of its body is read or parsed,
    and never learns what the coordinator would have thought of it."""
    path = _route_path(scope)
    if path in PUBLIC_PATHS or path.startswith(_PUBLIC_PREFIXES):
        return
    principal = principal_of(settings, _authorization(scope["headers"]))
    if path.startswith(_ADMIN_PREFIXES) or path == _ADMIN_PREFIX.rstrip("/"):
        if principal.scope != "admin":
            raise Forbidden("this route needs an admin token")
    elif path.startswith(_GROUP_PREFIX):
        check_group_access(principal, path[len(_GROUP_PREFIX) :].partition("/")[0])
    scope.setdefault("state", {})[_PRINCIPAL] = principal


def _route_path(scope: Scope) -> str:
    """The path the router matches: without the root path a proxy mounts the app under."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


def _authorization(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The one ``Authorization`` header's value, empty when absent. Two are refused: a proxy
    and a client could each believe theirs is the one that counts."""
    values = [value for name, value in headers if name == b"authorization"]
    if len(values) > 1:
        raise Unauthorized("more than one Authorization header")
    return values[0].decode("latin-1") if values else ""


def authenticate(request: Request) -> Principal:
    """The principal ``admit`` found for this request."""
    return admitted(request.scope)


def admitted(scope: Scope) -> Principal:
    """The principal ``admit`` found for a request, from its ASGI scope (the commit fast
    path has no ``Request``)."""
    principal: Principal | None = scope.get("state", {}).get(_PRINCIPAL)
    if principal is None:
        raise Unauthorized("missing bearer token")
    return principal


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
