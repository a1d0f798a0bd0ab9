"""A stream-table join: orders enriched with their customer, over two co-partitioned topics
keyed by customer id. The sticky stream-join assignor gives the same key range of both
topics to the same task, so an order always meets its customer's latest record.

Topics from the environment: ``JOIN_ORDERS`` (default ``orders``), ``JOIN_CUSTOMERS``
(default ``customers``), ``JOIN_OUTPUT`` (default ``enriched-orders``). Run it with a task
idle wait (``--max-task-idle-ms``) so an order waits for customer records that are due.
"""

from __future__ import annotations

import os
from typing import Any

from client.streams import JSON, STRING, Processor, StoreSpec, Topology


class RememberCustomer(Processor):
    def process(self, key: str, value: Any) -> None:
        customers = self.context.state_store("customers")
        if value is None:
            customers.delete(key)
        else:
            customers.put(key, value)


class EnrichOrder(Processor):
    def process(self, key: str, value: Any) -> None:
        customer = self.context.state_store("customers").get(key)
        self.context.forward(key, {"order": value, "customer": customer})


def build_topology() -> Topology:
    orders = os.environ.get("JOIN_ORDERS", "orders")
    customers = os.environ.get("JOIN_CUSTOMERS", "customers")
    output = os.environ.get("JOIN_OUTPUT", "enriched-orders")
    return (
        Topology()
        .add_source("customers", customers, key_serde=STRING, value_serde=JSON)
        .add_source("orders", orders, key_serde=STRING, value_serde=JSON)
        .add_processor("customers-table", RememberCustomer, "customers")
        .add_processor("enrich", EnrichOrder, "orders")
        .add_state_store(StoreSpec("customers", STRING, JSON), "customers-table", "enrich")
        .add_sink("out", output, "enrich", key_serde=STRING, value_serde=JSON)
    )
