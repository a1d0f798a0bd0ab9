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
from dataclasses import dataclass, field

TREND_WINDOW_S = 600.0
TREND_STEP_S = 5.0


@dataclass(frozen=True)
class TrendSample:
    """``processed``: offsets below the stable offsets plus IC offsets, over the partitions;
    ``lag`` None when no high watermark was known."""

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
