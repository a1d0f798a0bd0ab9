from collections.abc import Sequence

from client.protocol.committed import CommittedOffsets

def write_literals(
    keys: Sequence[tuple[str, str, int]], states: Sequence[CommittedOffsets]
) -> tuple[list[str], list[str]]: ...
