"""``keyrange admin``: the admin API from a terminal, read like kafka-consumer-groups. It needs
only what a plain ``pip install keyrange`` brings (httpx and the standard library)."""
