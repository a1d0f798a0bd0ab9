"""State changes from another origin's web page are refused (cross-site request forgery).

A page on any origin can make a visitor's browser send a "simple" request to the
coordinator (a form POST, a bodiless fetch POST) without asking first, and the browser
sends it whatever the answer's CORS headers say. With no token configured (the default on a
developer machine, where every caller is the local admin), such a request would act: a page
could force a group to rebalance. The coordinator serves no other origin, so a request that
changes state is accepted from a browser only when the browser says it comes from the
coordinator's own origin: in ``Sec-Fetch-Site`` (every current browser), or, from an older
one, in an ``Origin`` naming the host the request was sent to. A request with neither
header was not sent by a web page (the SDK, the CLI, curl, KEDA) and passes.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import Scope

from coordinator.errors import Forbidden

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# "none": the user typed the address or used a bookmark, no page was involved.
_OWN_SITES = frozenset({b"same-origin", b"none"})


def refuse_cross_origin(scope: Scope) -> None:
    """Forbidden for a state-changing request a browser sent from another origin."""
    if scope["method"] in _SAFE_METHODS:
        return
    fetch_site = _header(scope["headers"], b"sec-fetch-site")
    if fetch_site is not None:
        if fetch_site.lower() in _OWN_SITES:
            return
        raise _refused(f"Sec-Fetch-Site: {fetch_site.decode('latin-1')}")
    origin = _header(scope["headers"], b"origin")
    if origin is None:
        return
    host = _header(scope["headers"], b"host")
    if host is not None and _host_of(origin) == host.decode("latin-1").lower():
        return
    raise _refused(f"Origin: {origin.decode('latin-1')}")


def _refused(evidence: str) -> Forbidden:
    return Forbidden(
        f"a web page of another origin may not change the coordinator's state ({evidence}); "
        "use the coordinator's own console, the keyrange CLI or the API from a program"
    )


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value.strip()
    return None


def _host_of(origin: bytes) -> str | None:
    """The host[:port] an ``Origin`` names; None for an opaque origin ("null")."""
    parts = urlsplit(origin.decode("latin-1"))
    return parts.netloc.lower() if parts.scheme in ("http", "https") and parts.netloc else None
