"""Histograms with vLLM's metric shape (latencies, and tokens per request), counted in plain
integers."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.core import HistogramMetricFamily

# vLLM 0.32's bounds (v1/metrics/buckets.py), so that dashboards and quantiles read alike.
REQUEST_LATENCY_BUCKETS: Final = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
TIME_TO_FIRST_TOKEN_BUCKETS: Final = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0),
    *(7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)


def one_two_five_bounds(largest: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `largest`: vLLM's buckets for tokens per request."""
    bounds: list[float] = []
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale > largest:
                return tuple(bounds)
            bounds.append(float(step * scale))
        scale *= 10


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...] = REQUEST_LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self, name: str, doc: str, labels: dict[str, str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=list(labels))
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric(list(labels.values()), buckets, self.total)
        return family


__all__ = [
    "REQUEST_LATENCY_BUCKETS",
    "TIME_TO_FIRST_TOKEN_BUCKETS",
    "Histogram",
    "one_two_five_bounds",
]
