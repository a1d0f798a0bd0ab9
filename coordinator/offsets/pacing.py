"""How the commit path shares the event loop with every other request.

A commit may name ``max_partitions_per_request`` (10,000) partitions; decoding their stored
rows and applying the algebra to them costs about 20 µs of CPU per partition, so done in one
go it held every other request of the process up for over 200 ms (bench/commit_stall.py).
The loops over a commit's partitions give the event loop a turn every ``PARTITIONS_PER_TURN``
partitions instead: each stretch stays near 20 ms, whatever the commit's size.
"""

from __future__ import annotations

PARTITIONS_PER_TURN = 1_000
