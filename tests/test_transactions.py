"""Every route that writes in the request's transaction commits it before the reply is sent:
a client that reads right after a 200 sees its write, and a failed commit is the request's
error, never a 200 followed by a rollback. (FastAPI's default for dependencies with yield
exits them after the reply; one admin test read the state from before its own reset.)"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from coordinator.app import create_app
from coordinator.db.engine import transaction
from tests.fixtures.coordinator import settings_for_tests


def _api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    """Every route, into included routers too (FastAPI includes them as routes of their own)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _api_routes(included.routes)


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for dependency in dependant.dependencies:
        yield dependency
        yield from _dependencies(dependency)


def test_every_transaction_commits_before_the_reply() -> None:
    app = create_app(settings_for_tests(), "postgresql+asyncpg://unused@localhost/unused")
    routes = list(_api_routes(app.routes))
    using = {
        route.path: [d.scope for d in _dependencies(route.dependant) if d.call is transaction]
        for route in routes
    }
    transactional = {path: scopes for path, scopes in using.items() if scopes}
    assert "/v1/admin/groups/{group_id}/offsets/reset" in transactional
    assert all(scope == "function" for scopes in transactional.values() for scope in scopes), (
        transactional
    )
