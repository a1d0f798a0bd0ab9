"""The intake: the one loop that takes records from the consumer and hands them to a runtime
(``run()``'s dispatcher, the worker's, the streams'), so how a fetch ends is decided once:

* the runtime's ``until`` is done (it stops or failed): the fetch is interrupted and the
  loop ends quietly;
* the consumer was stopped: its ``ConsumerStopped`` ends the loop quietly, since the stop
  itself finishes the runtime;
* anything else (``ConsumerStopped`` of a consumer that is not stopped, a failed membership,
  a Kafka error) is raised to the runtime, which fails with it.

Each record taken in is charged to the runtime's byte budget, when it has one, before the
runtime gets it: the runtime refunds it when it finishes, gives back or drops the record.
A runtime that holds its records in a bounded queue instead returns what to wait for when the
queue is full, and the loop takes nothing more until it is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from client.errors import ConsumerStopped
from client.fetcher import FetchInterrupted, Item
from client.runtime.budget import ByteBudget, weight
from client.runtime.seams import RecordSource

# What a runtime does with a record taken in: None to go on at once, or an awaitable the
# intake waits for before it takes the next record (``run()``'s bounded queue).
Take = Callable[[Item], Awaitable[None] | None]


class Intake:
    def __init__(self, source: RecordSource, take: Take, budget: ByteBudget | None = None) -> None:
        self._source = source
        self._take = take
        self._budget = budget

    async def run(self, until: asyncio.Future[None]) -> None:
        """Take records until ``until`` is done or the consumer is stopped; raise what else
        ended the fetch."""
        source, take, budget = self._source, self._take, self._budget
        while not until.done():
            try:
                item = await source.next_item(until)
            except FetchInterrupted:
                return
            except ConsumerStopped:
                if source.stopped:
                    return
                raise
            if budget is not None:
                budget.charge(item[0], weight(item[1]))
            wait = take(item)
            # Not kept while the fetch waits: a finished record would live on in this frame.
            del item
            if wait is not None:
                await wait
