"""Where things go on the console's bars and charts: pure geometry, no I/O and no HTML.

Two axes. The key-space bar maps the 63-bit hash space ``[0, 2^63-1]`` onto ``[0, 1]`` and
colours each hash range by the member owning it, gaps included, so a partition's bar always
covers the whole space and an unowned range is visible as such. The offset axis maps a
partition's log onto ``[0, 1]`` from its start to the high watermark, so the processed part,
the stable offset, the IC ranges and watermark pieces above it and the lag sit where they are
in the log. A group's trend charts map the last minutes onto a line each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from client.protocol.keyspace import HASH_MAX, HASH_SPACE
from coordinator.core.trend import TrendPoint

# Colours that stay tellable apart for the first members of a group and on a white page; a
# group with more members reuses them in order, and the members table names each colour.
MEMBER_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#17becf",
)
UNOWNED_COLOUR = "#d9d9d9"


@dataclass(frozen=True)
class Span:
    """A stretch of an axis: ``start`` and ``width`` as fractions of the axis length."""

    start: float
    width: float


@dataclass(frozen=True)
class OwnedSegment:
    """A hash range on the key-space bar and its owner (None: nobody owns it now)."""

    first_hash: int
    last_hash: int
    owner: str | None
    span: Span


def key_range_span(first_hash: int, last_hash: int) -> Span:
    """Where the closed hash range ``[first_hash, last_hash]`` lies on the key-space bar."""
    if not 0 <= first_hash <= last_hash <= HASH_MAX:
        raise ValueError(f"[{first_hash}, {last_hash}] is not a range of the hash space")
    return Span(first_hash / HASH_SPACE, (last_hash - first_hash + 1) / HASH_SPACE)


def ownership_bar(owned: Mapping[str, Iterable[Sequence[int]]]) -> list[OwnedSegment]:
    """The key-space bar of one partition: each member's ranges, and the unowned gaps
    between them, in hash order, covering ``[0, 2^63-1]`` exactly once.

    Ranges two members both claim (a hand-off in flight is never drawn that way, since a
    member owns a range only once the other released it) are drawn for the first member.
    """
    claimed = sorted(
        (int(first), int(last), member)
        for member, ranges in owned.items()
        for first, last in ranges
    )
    segments: list[OwnedSegment] = []
    next_free = 0
    for first, last, member in claimed:
        first = max(first, next_free)
        if first > last:
            continue
        if first > next_free:
            segments.append(_segment(next_free, first - 1, None))
        segments.append(_segment(first, last, member))
        next_free = last + 1
    if next_free <= HASH_MAX:
        segments.append(_segment(next_free, HASH_MAX, None))
    return segments


def _segment(first: int, last: int, owner: str | None) -> OwnedSegment:
    return OwnedSegment(first, last, owner, key_range_span(first, last))


def member_colours(member_ids: Iterable[str]) -> dict[str, str]:
    """A colour per member, by sorted member id, so a refresh never swaps two colours."""
    return {
        member: MEMBER_COLOURS[index % len(MEMBER_COLOURS)]
        for index, member in enumerate(sorted(set(member_ids)))
    }


@dataclass(frozen=True)
class OffsetAxis:
    """Offsets ``[low, high)`` along the axis; ``high`` is exclusive, like a high watermark."""

    low: int
    high: int

    def position(self, offset: int) -> float:
        """Where ``offset`` lies, clamped to the axis."""
        clamped = min(max(offset, self.low), self.high)
        return (clamped - self.low) / (self.high - self.low)

    def span(self, first: int, end: int) -> Span:
        """The offsets ``[first, end)`` on the axis (empty when they lie outside it)."""
        start = self.position(first)
        return Span(start, max(0.0, self.position(end) - start))


def offset_axis(
    stable_offset: int,
    high_watermark: int | None,
    ic_ranges: Iterable[Sequence[int]],
    watermarks: Iterable[Sequence[int]],
    log_start: int = 0,
) -> OffsetAxis:
    """The axis for one partition: the log from its start to the high watermark, widened to
    take in a stable offset, IC range or watermark piece beyond either end (a high watermark
    read before the latest commits, or none known at all). The whole log, so a caught-up
    partition reads "0 … 10,000" rather than a sliver around its stable offset."""
    low = min(log_start, stable_offset)
    high = stable_offset if high_watermark is None else max(high_watermark, stable_offset)
    for _, last in ic_ranges:
        high = max(high, int(last) + 1)
    for piece in watermarks:
        high = max(high, int(piece[2]))
    return OffsetAxis(low, max(high, low + 1))


# The finest detail worth drawing: a thousandth of the axis, about a pixel of a bar on a
# laptop screen. IC ranges closer than that are drawn as one band, so a partition with tens of
# thousands of them costs the page at most a thousand shapes.
DRAWN_RESOLUTION = 0.001


@dataclass(frozen=True)
class OffsetBand:
    """IC ranges drawn together: the first offset of the first, the last of the last."""

    first: int
    last: int
    ranges: int


def offset_bands(
    ic_ranges: Iterable[Sequence[int]], axis: OffsetAxis, resolution: float = DRAWN_RESOLUTION
) -> list[OffsetBand]:
    """The IC ranges as bands on ``axis``, merging those less than ``resolution`` apart."""
    closest = (axis.high - axis.low) * resolution
    bands: list[OffsetBand] = []
    for first, last in sorted((int(first), int(last)) for first, last in ic_ranges):
        if bands and first - bands[-1].last - 1 < closest:
            previous = bands[-1]
            bands[-1] = OffsetBand(previous.first, max(previous.last, last), previous.ranges + 1)
        else:
            bands.append(OffsetBand(first, last, 1))
    return bands


@dataclass(frozen=True)
class Chart:
    """A line over the last ``window_s`` seconds in a ``1000 x 100`` box: ``points`` for an
    SVG polyline, ``peak`` the value at the top edge, ``latest`` the newest value."""

    points: str
    peak: float
    latest: float | None


CHART_WIDTH = 1000
CHART_HEIGHT = 100


def chart(points: Sequence[TrendPoint], window_s: float) -> Chart:
    """Newest on the right; the vertical scale from 0 to the highest value drawn, so a flat
    line at the bottom means none and one at the top means steady."""
    if not points:
        return Chart("", 0.0, None)
    peak = max(max(point.value for point in points), 0.0)
    scale = peak if peak > 0 else 1.0
    drawn = " ".join(
        f"{CHART_WIDTH * (1 - min(point.age_s, window_s) / window_s):.1f},"
        f"{CHART_HEIGHT * (1 - max(point.value, 0.0) / scale):.1f}"
        for point in sorted(points, key=lambda point: -point.age_s)
    )
    newest = min(points, key=lambda point: point.age_s)
    return Chart(drawn, peak, newest.value)
