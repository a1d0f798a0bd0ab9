"""The runtime kernel every runtime built on the consumer stands on (``run()``'s dispatcher,
``client.worker``, ``client.streams``): the seams between the consumer and a runtime
(``seams``), the one loop taking records from the consumer (``intake``), the byte budget that
pauses a partition holding too much (``budget``), the ownership gate asked before user code
starts a record (``gate``), the lifecycle hooks every part hears ownership changes and the
stop through (``hooks``), and the pools user code runs on (``pools``: the loop, threads,
processes)."""
