"""A latency histogram with vLLM's metric shape, counted in plain integers."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.core import HistogramMetricFamily

BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(slots=True)
class LatencyHistogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds

    def family(self, name: str, doc: str, labels: dict[str, str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=list(labels))
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, BUCKETS), "+Inf"), self.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric(list(labels.values()), buckets, self.total)
        return family


__all__ = ["BUCKETS", "LatencyHistogram"]
