"""Orders enriched from a customers table, in the DSL: the customers topic (compacted, keyed
by customer id) is read as a table whose store uses that topic as its changelog, and each
order (keyed by customer id, co-partitioned with customers) is joined with its customer.

    keyrange streams examples.streams_dsl_orders:build_topology --application-id orders \\
        --bootstrap localhost:9092 --coordinator http://localhost:8080 --max-task-idle-ms 2000

Topics from the environment: ``JOIN_ORDERS`` (default ``orders``), ``JOIN_CUSTOMERS``
(default ``customers``), ``JOIN_OUTPUT`` (default ``enriched-orders``). A task idle wait
lets an order wait for the customer records due before it.
"""

from __future__ import annotations

import os
from typing import Any

from client.streams import JSON, STRING, Topology
from client.streams.dsl import StreamsBuilder


def enrich(order: Any, customer: Any) -> dict[str, Any]:
    return {"order": order, "customer": customer}


def build_topology() -> Topology:
    orders = os.environ.get("JOIN_ORDERS", "orders")
    customers = os.environ.get("JOIN_CUSTOMERS", "customers")
    output = os.environ.get("JOIN_OUTPUT", "enriched-orders")
    builder = StreamsBuilder()
    table = builder.table(customers, key_serde=STRING, value_serde=JSON, store="customers")
    (
        builder.stream(orders, key_serde=STRING, value_serde=JSON)
        .left_join(table, enrich)
        .to(output, key_serde=STRING, value_serde=JSON)
    )
    return builder.build()
