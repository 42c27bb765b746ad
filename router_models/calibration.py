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

from typing import Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator
from sklearn.isotonic import IsotonicRegression
from sklearn.utils.validation import check_is_fitted

from router_models.isotonic_maps import IsotonicMaps, ladder_monotone

__all__ = ["TierCalibration", "ladder_monotone"]


class TierCalibration(BaseEstimator, IsotonicMaps):  # type: ignore[misc]
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

    def predict_proba(self, scores: ArrayLike) -> NDArray[np.float64]:
        check_is_fitted(self, "thresholds_x_")
        return super().predict_proba(scores)

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
