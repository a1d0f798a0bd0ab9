"""The runtime kernel every runtime built on the consumer stands on (``run()``'s dispatcher,
``client.worker``, ``client.streams``): the ownership gate asked before user code starts a
record, and the pools user code runs on."""
