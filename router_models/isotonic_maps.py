"""Fitted tier calibration as plain breakpoints: what a router needs to serve requests.

`IsotonicMaps` holds, per calibrated tier, the breakpoints of a non-increasing map from the
difficulty score to P(tier adequate), and evaluates them with `np.interp` (batch) or `bisect`
(one request). It imports neither scikit-learn nor SciPy, so a gateway that only serves loads
a model without them; `calibration.TierCalibration` fits the maps (scikit-learn's
`IsotonicRegression`) and is one of these.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["IsotonicMaps", "ladder_monotone"]


class IsotonicMaps:
    """K-1 (or K with `include_top`) breakpoint maps, monotone along the ladder on output."""

    thresholds_x_: list[NDArray[np.float64]]
    thresholds_y_: list[NDArray[np.float64]]
    n_tiers_: int
    n_labelled_: list[int]

    def __init__(self, include_top: bool = False, centered: bool = True) -> None:
        self.include_top = include_top
        self.centered = centered

    @classmethod
    def from_thresholds(
        cls,
        thresholds_x: list[NDArray[np.float64]],
        thresholds_y: list[NDArray[np.float64]],
        include_top: bool = False,
        n_labelled: list[int] | None = None,
        centered: bool = True,
    ) -> Self:
        """A fitted calibration from stored breakpoints (what model_io saves)."""
        if len(thresholds_x) != len(thresholds_y) or not thresholds_x:
            raise ValueError("need one (x, y) breakpoint pair per calibrated tier")
        for bx, by in zip(thresholds_x, thresholds_y, strict=True):
            if bx.ndim != 1 or bx.shape != by.shape or bx.size == 0:
                raise ValueError("breakpoints must be non-empty 1-d arrays of equal length")
            if not (np.all(np.isfinite(bx)) and np.all(np.isfinite(by))):
                # NaN compares false, so it would pass the order checks below.
                raise ValueError("breakpoints must be finite")
            if np.any(np.diff(bx) <= 0) or np.any(np.diff(by) > 0):
                raise ValueError("breakpoints must have increasing x and non-increasing y")
            if by.min() < 0.0 or by.max() > 1.0:
                raise ValueError("calibrated probabilities must lie in [0, 1]")
        cal = cls(include_top=include_top, centered=centered)
        cal.thresholds_x_ = [np.asarray(b, dtype=np.float64) for b in thresholds_x]
        cal.thresholds_y_ = [np.asarray(b, dtype=np.float64) for b in thresholds_y]
        cal.n_tiers_ = len(thresholds_x) + (0 if include_top else 1)
        cal.n_labelled_ = list(n_labelled) if n_labelled is not None else []
        cal._build_lean()
        return cal

    def predict_proba(self, scores: ArrayLike) -> NDArray[np.float64]:
        """(n, K) probabilities, monotone non-decreasing along the ladder, in [0, 1]."""
        x = np.asarray(scores, dtype=np.float64).reshape(-1)
        out = np.ones((x.shape[0], self.n_tiers_), dtype=np.float64)
        for k, (bx, by) in enumerate(zip(self.thresholds_x_, self.thresholds_y_, strict=True)):
            out[:, k] = np.interp(x, bx, by)
        return ladder_monotone(out)

    def predict_one(self, score: float) -> tuple[float, ...]:
        """`predict_proba([score])[0]` on plain floats: no numpy call, one tuple allocated."""
        out: list[float] = []
        best = 0.0
        for bx, by in self._lean:
            i = bisect_right(bx, score)
            if i == 0:
                p = by[0]
            elif i == len(bx):
                p = by[-1]
            else:
                # The same arithmetic as np.interp, so both paths agree to the last bit.
                x0 = bx[i - 1]
                y0 = by[i - 1]
                p = (by[i] - y0) / (bx[i] - x0) * (score - x0) + y0
            best = max(best, p)
            out.append(min(best, 1.0))
        if not self.include_top:
            out.append(1.0)
        return tuple(out)

    def _build_lean(self) -> None:
        self._lean: list[tuple[list[float], list[float]]] = [
            (bx.tolist(), by.tolist())
            for bx, by in zip(self.thresholds_x_, self.thresholds_y_, strict=True)
        ]


def ladder_monotone(proba: NDArray[np.float64]) -> NDArray[np.float64]:
    """Running maximum along the ladder (axis 1), clipped to [0, 1]; NaN becomes 0."""
    clean = np.where(np.isnan(proba), 0.0, proba)
    return np.clip(np.maximum.accumulate(clean, axis=1), 0.0, 1.0)
