"""The protocol kernel: the vocabulary the coordinator and the client both speak.

Key hashing, key ranges and the hash bounds (``keyspace``), committed-offsets state with its
offset bounds and watermark rules (``committed``), positions outside a partition's log and the
reset policy (``log_bounds``), the slice wire codec (``wire``), the member epochs (``epochs``)
and the error names (``error_names``). Pure: the standard library and
``mmh3`` only, no I/O and no framework, so both sides import it and neither keeps a copy that
could drift. It lives in the client package because a worker installs the client without the
server (``pip install keyrange``), and the coordinator depends on the client's kernel, never
the other way round (docs/architecture.md).
"""
