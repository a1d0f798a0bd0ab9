"""The runtime kernel every runtime built on the consumer stands on (``run()``'s dispatcher,
``client.worker``, ``client.streams``): the seams between the consumer and a runtime
(``seams``), the ownership gate asked before user code starts a record (``gate``), and the
pools user code runs on."""
