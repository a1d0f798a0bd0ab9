"""A group's lag and throughput over the last minutes, for the console's chart: the figures
someone opening the console after a page wants first (is it getting worse, is anything being
processed at all).

Each replica keeps its own samples, taken when the group's page is drawn (every refresh of an
open console tab); nothing is stored, so a restart or another replica starts a fresh trend. A
sample closer than ``step_s`` to the last kept one replaces it, so a few open tabs cost no more
memory than one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

TREND_WINDOW_S = 600.0
TREND_STEP_S = 5.0


HASH_SPACE = 2**63


def processed_estimate(
    stable_offset: int, ic_offsets: int, watermarks: Iterable[tuple[int, int, int]]
) -> int:
    """Offsets a partition's committed state counts as processed: those below the stable
    offset, the IC offsets, and for each watermark piece ``(first hash, last hash,
    watermark)`` the offsets between the stable offset and its watermark by the piece's share
    of the hash space. Watermarks are how members commit by default, and a hot key's head can
    hold the stable offset still for a long while: without them the console showed 0 records/s
    while thousands were processed. The share is an estimate: with skewed keys a piece's share
    of the records differs from its share of the hash space."""
    above = sum(
        (watermark - stable_offset) * (last - first + 1) / HASH_SPACE
        for first, last, watermark in watermarks
        if watermark > stable_offset
    )
    return stable_offset + ic_offsets + round(above)


@dataclass(frozen=True)
class TrendSample:
    """``processed``: ``processed_estimate`` summed over the partitions; ``lag`` None when no
    high watermark was known."""

    at_s: float
    lag: int | None
    processed: int


@dataclass(frozen=True)
class TrendPoint:
    """A figure ``age_s`` seconds before the newest sample."""

    age_s: float
    value: float


@dataclass
class GroupTrend:
    window_s: float = TREND_WINDOW_S
    step_s: float = TREND_STEP_S
    samples: deque[TrendSample] = field(default_factory=deque)

    def add(self, sample: TrendSample) -> None:
        if self.samples and sample.processed < self.samples[-1].processed:
            # Progress went backwards (an offset reset, the group recreated): a rate across
            # it would be negative nonsense.
            self.samples.clear()
        if len(self.samples) >= 2 and sample.at_s - self.samples[-2].at_s < self.step_s:
            self.samples.pop()
        self.samples.append(sample)
        while self.samples and self.samples[0].at_s < sample.at_s - self.window_s:
            self.samples.popleft()

    def lag(self) -> list[TrendPoint]:
        newest = self.samples[-1].at_s if self.samples else 0.0
        return [
            TrendPoint(newest - sample.at_s, float(sample.lag))
            for sample in self.samples
            if sample.lag is not None
        ]

    def rate(self) -> list[TrendPoint]:
        """Records processed per second between consecutive samples, at the later one."""
        if len(self.samples) < 2:
            return []
        newest = self.samples[-1].at_s
        points = []
        previous = self.samples[0]
        for sample in list(self.samples)[1:]:
            span = sample.at_s - previous.at_s
            if span > 0:
                rate = (sample.processed - previous.processed) / span
                points.append(TrendPoint(newest - sample.at_s, rate))
            previous = sample
        return points
