"""Calibration: one isotonic regression per tier maps the difficulty score to P(tier adequate).

The score grows with difficulty, so every map is non-increasing in the score. After the per-tier
maps the probabilities are made monotone along the ladder (running maximum from the cheapest
tier: a more precise tier is never less likely to be adequate) and lie in [0, 1].

A finite calibration set never proves certainty, so a non-top tier's probability is capped at
`1 - 1/(n + 2)` (Laplace's rule of succession, n = that tier's labelled rows). This keeps the
meaning of the two extreme thresholds exact: 0 sends everything to the cheapest tier and 1.0
sends everything to the top tier. Under the default relative label the top tier is the
reference and its probability is exactly 1.0.

The fitted state is the isotonic breakpoints (`IsotonicRegression.X_thresholds_` and
`y_thresholds_`), so `predict_proba` is `np.interp` exactly as `IsotonicRegression.predict`, and
`predict_one` is the same interpolation done with `bisect` on plain floats for the hot path.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator
from sklearn.isotonic import IsotonicRegression
from sklearn.utils.validation import check_is_fitted

__all__ = ["TierCalibration", "ladder_monotone"]


class TierCalibration(BaseEstimator):  # type: ignore[misc]
    """K-1 (or K) isotonic maps from difficulty score to per-tier adequacy probability.

    Parameters
    ----------
    include_top:
        False (default, relative label): `adequate` has K-1 columns and the top tier is the
        reference with probability 1.0. True (absolute label): `adequate` has K columns and the
        top tier is calibrated like the others.
    centered:
        True (default): centred isotonic regression. The isotonic fit's blocks (runs of equal
        fitted value) become points at the block's mean score, joined by straight lines, so the
        map falls strictly between blocks. Plain isotonic maps are flat inside a block, which
        ties hundreds of requests at one probability that no threshold can split (on the MMLU
        set that cost about 0.006 APGR); the centred map keeps the block means, so calibration
        is unchanged to first order. False: `IsotonicRegression.predict` exactly.
    """

    def __init__(self, include_top: bool = False, centered: bool = True) -> None:
        self.include_top = include_top
        self.centered = centered

    def fit(self, scores: ArrayLike, adequate: ArrayLike) -> Self:
        """Fit one isotonic map per labelled column; NaN in `adequate` means "no label"."""
        x = np.asarray(scores, dtype=np.float64).reshape(-1)
        y = np.asarray(adequate, dtype=np.float64)
        if y.ndim != 2 or y.shape[0] != x.shape[0] or y.shape[1] < 1:
            raise ValueError("adequate must have shape (n_scores, n_calibrated_tiers)")
        if not np.all(np.isfinite(x)):
            raise ValueError("scores must be finite")
        labelled = ~np.isnan(y)
        if np.any((y[labelled] < 0.0) | (y[labelled] > 1.0)):
            raise ValueError("adequacy labels must lie in [0, 1]")
        xs: list[NDArray[np.float64]] = []
        ys: list[NDArray[np.float64]] = []
        counts = labelled.sum(axis=0)
        if not np.any(counts >= 2):
            raise ValueError("no calibrated tier has at least 2 labelled rows")
        for k in range(y.shape[1]):
            rows = labelled[:, k]
            n = int(counts[k])
            if n < 2:
                # Shadow labels can leave a tier unlabelled. A more precise tier is never less
                # likely adequate, so the next cheaper tier's map is an honest lower bound; a
                # cheapest tier without labels gets probability 0 (never chosen on a guess).
                bx, by = (xs[-1], ys[-1]) if xs else (np.zeros(1), np.zeros(1))
                xs.append(bx)
                ys.append(by)
                continue
            cap = 1.0 - 1.0 / (n + 2.0)
            iso = IsotonicRegression(increasing=False, y_min=0.0, y_max=cap, out_of_bounds="clip")
            iso.fit(x[rows], y[rows, k])
            if self.centered:
                bx, by = _centered(x[rows], iso)
            else:
                bx, by = iso.X_thresholds_, iso.y_thresholds_
            xs.append(np.asarray(bx, dtype=np.float64))
            ys.append(np.asarray(by, dtype=np.float64))
        self.thresholds_x_ = xs
        self.thresholds_y_ = ys
        self.n_tiers_ = y.shape[1] + (0 if self.include_top else 1)
        self.n_labelled_ = [int(c) for c in labelled.sum(axis=0)]
        self._build_lean()
        return self

    @classmethod
    def from_thresholds(
        cls,
        thresholds_x: list[NDArray[np.float64]],
        thresholds_y: list[NDArray[np.float64]],
        include_top: bool = False,
        n_labelled: list[int] | None = None,
        centered: bool = True,
    ) -> TierCalibration:
        """A fitted calibration from stored breakpoints (what model_io saves)."""
        if len(thresholds_x) != len(thresholds_y) or not thresholds_x:
            raise ValueError("need one (x, y) breakpoint pair per calibrated tier")
        for bx, by in zip(thresholds_x, thresholds_y, strict=True):
            if bx.ndim != 1 or bx.shape != by.shape or bx.size == 0:
                raise ValueError("breakpoints must be non-empty 1-d arrays of equal length")
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
        check_is_fitted(self, "thresholds_x_")
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

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "thresholds_x_")


def _centered(
    x: NDArray[np.float64], iso: IsotonicRegression
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Breakpoints of the centred isotonic map: (mean score, value) of each fitted block."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    fitted = np.asarray(iso.predict(xs), dtype=np.float64)
    # A block is a run of equal fitted values (scores are sorted, so runs are contiguous).
    starts = np.r_[0, np.flatnonzero(np.diff(fitted) != 0) + 1]
    sums = np.add.reduceat(xs, starts)
    counts = np.diff(np.r_[starts, xs.size])
    mid = sums / counts
    value = fitted[starts]
    keep = np.r_[True, np.diff(mid) > 0]  # equal means can only come from tied scores
    return mid[keep], value[keep]


def ladder_monotone(proba: NDArray[np.float64]) -> NDArray[np.float64]:
    """Running maximum along the ladder (axis 1), clipped to [0, 1]; NaN becomes 0."""
    clean = np.where(np.isnan(proba), 0.0, proba)
    return np.clip(np.maximum.accumulate(clean, axis=1), 0.0, 1.0)
