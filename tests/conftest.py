"""Suite-wide fixtures and markers.

A test is marked ``db``, ``kafka`` or ``spark`` from the fixtures it uses, directly or through
other fixtures, so ``pytest -m "not kafka"`` runs alone without starting the broker (and
likewise for Postgres and Spark). Tests that start a service themselves carry the marker
explicitly.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.fixtures.services", "tests.fixtures.coordinator"]

_MARKER_OF_FIXTURE = {
    "postgres_server_url": "db",
    "embedded_postgres": "db",
    "kafka_bootstrap": "kafka",
    "spark": "spark",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = getattr(item, "fixturenames", ())
        for fixture, marker in _MARKER_OF_FIXTURE.items():
            if fixture in used:
                item.add_marker(marker)
