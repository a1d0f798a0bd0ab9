from collections.abc import Sequence

def apply(
    stable_offset: int,
    stored_ranges: tuple[tuple[int, int], ...],
    stored_pieces: tuple[tuple[int, int, int], ...],
    ranges: Sequence[tuple[int, int]],
    watermarks: Sequence[tuple[int, int, int]],
    max_ic_ranges: int,
    max_watermark_pieces: int,
) -> (
    tuple[int, tuple[tuple[int, int], ...], tuple[tuple[int, int, int], ...], bool, bool, bool]
    | None
): ...
