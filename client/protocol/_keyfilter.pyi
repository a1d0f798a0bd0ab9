from collections.abc import Callable, Sequence
from typing import Any

class MalformedBatch(ValueError): ...

def select(
    batch: bytes | memoryview, position: int, bounds: Sequence[tuple[int, int]]
) -> tuple[int, list[bytes | None], list[bytes | None]] | None: ...
def scan(
    batch: bytes | memoryview,
    body: bytes | memoryview | None,
    position: int,
    bounds: Sequence[tuple[int, int, int]],
    make: Callable[..., Any],
    fields: tuple[str, ...] | None,
    topic: str,
    partition: int,
    key_decode: Callable[[bytes], Any] | None,
    value_decode: Callable[[bytes], Any] | None,
) -> tuple[list[Any], list[int], list[int]] | None: ...
def key_hash(key: bytes | memoryview) -> int: ...
