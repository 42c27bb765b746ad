"""Calibration monitoring from shadow labels: predicted against observed adequacy, ECE,
drift alarms. Pure bookkeeping over bounded windows of recent labels."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

_BINS: Final = 10


@dataclass(frozen=True, slots=True)
class Label:
    """One shadow verdict: the probability the router gave, the score behind it, the truth."""

    predicted: float | None
    score: float | None
    adequate: bool
    at: float


@dataclass(frozen=True, slots=True)
class CalibrationSummary:
    n: int
    predicted: float | None  # mean predicted P(adequate) over labels that had one
    observed: float  # share judged adequate
    # Expected calibration error, 10 equal-width bins; None below min_labels labels with a
    # prediction, as for drift: a handful is noise (one label at 0.8 reads 0.2).
    ece: float | None
    drift: bool  # over labels with a prediction: observed below predicted beyond the margin


def expected_calibration_error(pairs: list[tuple[float, bool]], bins: int = _BINS) -> float:
    """sum_b |B|/n * |mean predicted in b - observed rate in b|."""
    if not pairs:
        return 0.0
    totals = [[0, 0.0, 0] for _ in range(bins)]  # count, sum predicted, sum adequate
    for predicted, adequate in pairs:
        index = min(bins - 1, max(0, int(predicted * bins)))
        totals[index][0] += 1
        totals[index][1] += predicted
        totals[index][2] += int(adequate)
    n = len(pairs)
    return sum(abs(s / c - a / c) * c / n for c, s, a in totals if c)


_ROUNDING = 1e-9  # far below one label's weight in any window the settings allow


class CalibrationMonitor:
    """Recent labels per (tenant, tier), bounded by `window`."""

    def __init__(self, window: int, margin: float, min_labels: int) -> None:
        self.window = window
        self.margin = margin
        self.min_labels = min_labels
        self._labels: dict[tuple[str, str], deque[Label]] = {}

    def reconfigure(self, window: int, margin: float, min_labels: int) -> None:
        """Follows a configuration reload: new bounds apply at once, and the labels kept are
        the newest that fit the window (the drift metric must not keep the old margin)."""
        self.margin = margin
        self.min_labels = min_labels
        if window != self.window:
            self.window = window
            for key, labels in self._labels.items():
                self._labels[key] = deque(labels, maxlen=window)

    def retain(self, tenants: Collection[str], tiers: Collection[str]) -> None:
        """Drops the labels of tenants and tiers a reload removed: they would go on being
        exported (a stale ECE keeps its alert firing) and listed."""
        self._labels = {
            key: labels
            for key, labels in self._labels.items()
            if key[0] in tenants and key[1] in tiers
        }

    def add(self, tenant: str, tier: str, label: Label) -> None:
        key = (tenant, tier)
        labels = self._labels.get(key)
        if labels is None:
            labels = self._labels[key] = deque(maxlen=self.window)
        labels.append(label)

    def labels(self, tenant: str, tier: str) -> list[Label]:
        return list(self._labels.get((tenant, tier), ()))

    def pairs(self) -> list[tuple[str, str]]:
        return sorted(self._labels)

    def summary(self, tenant: str, tier: str) -> CalibrationSummary:
        labels = self._labels.get((tenant, tier), deque())
        n = len(labels)
        observed = sum(label.adequate for label in labels) / n if n else 0.0
        pairs = [
            (label.predicted, label.adequate) for label in labels if label.predicted is not None
        ]
        predicted = sum(p for p, _ in pairs) / len(pairs) if pairs else None
        # Drift compares like with like: the labels that carried a prediction. Labels without
        # one (pinned requests, tenants without routing) are other traffic, often harder.
        scored_observed = sum(adequate for _, adequate in pairs) / len(pairs) if pairs else 0.0
        drift = (
            predicted is not None
            and len(pairs) >= self.min_labels
            # Beyond the margin, not at it: ten predictions of 0.7 average 0.7000000000000001.
            and scored_observed < predicted - self.margin - _ROUNDING
        )
        return CalibrationSummary(
            n=n,
            predicted=predicted,
            observed=observed,
            ece=expected_calibration_error(pairs) if len(pairs) >= self.min_labels else None,
            drift=drift,
        )


__all__ = ["CalibrationMonitor", "CalibrationSummary", "Label", "expected_calibration_error"]
