"""Evaluation of calibrated probabilities on labelled data: calibration and routing quality.

Per non-top tier: ROC AUC, expected calibration error (10 equal-width bins, weighted mean of
|mean predicted - observed adequacy|), Brier score, all against the adequacy label the model
was trained for.

APGR and CPT follow RouteLLM between two models: PGR = (quality - q_cheap) / (q_top - q_cheap),
plotted against the share of calls to the top model; APGR is the area under that curve and
CPT(x%) the smallest share of top calls reaching PGR x (interpolated along the curve). For a
ladder of K tiers we replace "share of calls to the top model" by the normalised cost
`(cost - c_cheap) / (c_top - c_cheap)` along the routed frontier of all K tiers, which is the
same thing when K = 2 (cost = c_cheap + share * (c_top - c_cheap)). So `cpt50 = 0.25` means
half the cheapest-to-top quality gap is recovered at a quarter of the cheapest-to-top cost gap.
RouteLLM sweeps 10 quantile thresholds; we use every distinct probability (the exact curve).
Random routing gives APGR 0.5 in expectation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.metrics import roc_auc_score

from router_models.costs import CostSource
from router_models.frontier import Frontier, routed_frontier, static_frontier, thin, uniform_points
from router_models.labels import Label, adequacy, routing_proba
from router_models.pretest import pretest
from router_models.thresholds import quality_floor, tune, uniform_baseline

__all__ = [
    "apgr_cpt",
    "brier",
    "calibration_metrics",
    "evaluate",
    "expected_calibration_error",
    "pgr_curve",
    "static_apgr",
]


def expected_calibration_error(
    predicted: ArrayLike, observed: ArrayLike, n_bins: int = 10
) -> float:
    """Weighted mean |mean predicted - mean observed| over equal-width probability bins."""
    p = np.asarray(predicted, dtype=np.float64)
    y = np.asarray(observed, dtype=np.float64)
    bins = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        in_bin = bins == b
        if in_bin.any():
            total += in_bin.sum() * abs(p[in_bin].mean() - y[in_bin].mean())
    return float(total / p.shape[0])


def brier(predicted: ArrayLike, observed: ArrayLike) -> float:
    p = np.asarray(predicted, dtype=np.float64)
    y = np.asarray(observed, dtype=np.float64)
    return float(np.mean((p - y) ** 2))


def calibration_metrics(
    proba: NDArray[np.float64], correct: NDArray[np.float64], tiers: Sequence[str], label: Label
) -> dict[str, dict[str, float | int | None]]:
    """AUC, ECE, Brier, base rate and count per non-top tier (rows with a label only)."""
    target = adequacy(correct, label)
    out: dict[str, dict[str, float | int | None]] = {}
    for k, tier in enumerate(tiers[:-1]):
        y = target[:, k]
        rows = ~np.isnan(y)
        p, yy = proba[rows, k], y[rows]
        binary = np.isin(yy, (0.0, 1.0)).all()
        auc = float(roc_auc_score(yy, p)) if binary and 0 < yy.sum() < yy.shape[0] else None
        out[tier] = {
            "n": int(rows.sum()),
            "base_rate": float(yy.mean()) if yy.size else None,
            "mean_predicted": float(p.mean()) if p.size else None,
            "auc": auc,
            "ece": expected_calibration_error(p, yy) if yy.size else None,
            "brier": brier(p, yy) if yy.size else None,
        }
    return out


def pgr_curve(
    frontier: Frontier, correct: NDArray[np.float64], costs: Sequence[float]
) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    """(normalised cost, PGR) along the frontier; None when the top tier is no better."""
    q0, q1 = float(correct[:, 0].mean()), float(correct[:, -1].mean())
    if q1 <= q0:
        return None
    x = (frontier.cost - costs[0]) / (costs[-1] - costs[0])
    return x, (frontier.quality - q0) / (q1 - q0)


def apgr_cpt(
    proba: NDArray[np.float64],
    correct: NDArray[np.float64],
    costs: Sequence[float],
    levels: Sequence[float] = (0.5, 0.8),
) -> tuple[float | None, list[float | None]]:
    """APGR and CPT at `levels` (fractions of normalised cost); None where undefined."""
    curve = pgr_curve(routed_frontier(proba, correct, costs), correct, costs)
    if curve is None:
        return None, [None for _ in levels]
    x, pgr = curve
    apgr = float(np.trapezoid(pgr, x))
    return apgr, [_first_crossing(x, pgr, level) for level in levels]


def static_apgr(correct: NDArray[np.float64], costs: Sequence[float]) -> float | None:
    """APGR of the static random split (0.5 for two tiers): what routing must beat."""
    curve = pgr_curve(static_frontier(correct, costs), correct, costs)
    if curve is None:
        return None
    x, pgr = curve
    return float(np.trapezoid(pgr, x))


def evaluate(
    proba: NDArray[np.float64],
    correct: NDArray[np.float64],
    tiers: Sequence[str],
    costs: Sequence[float],
    *,
    label: Label = "relative",
    alpha: float = 0.95,
    cost_source: CostSource | str = CostSource.PRECISION,
    max_points: int = 101,
) -> dict[str, Any]:
    """The `tiergate router evaluate --json` document for held-out probabilities."""
    complete = ~np.isnan(correct).any(axis=1)
    c, p = correct[complete], routing_proba(proba, label)[complete]
    doc: dict[str, Any] = {
        "n": int(correct.shape[0]),
        "n_complete": int(complete.sum()),
        "tiers": list(tiers),
        "label": label,
        "costs": dict(zip(tiers, map(float, costs), strict=True)),
        "costs_source": str(cost_source),
        "per_tier": calibration_metrics(proba, correct, tiers, label),
        "alpha": alpha,
    }
    if not complete.any():
        # Shadow labels score one cheaper tier per request: calibration can be judged, the
        # cost-quality curves cannot (they need every tier's score on the same rows).
        doc["note"] = (
            "no row has every tier's score: frontiers, APGR/CPT, tune and the "
            "pre-test need complete rows"
        )
        return doc
    front = routed_frontier(p, c, costs)
    apgr, (cpt50, cpt80) = apgr_cpt(p, c, costs)
    floor = quality_floor(c, alpha)
    baseline, _ = uniform_baseline(c, costs, floor)
    doc.update(
        {
            "apgr": apgr,
            "apgr_static": static_apgr(c, costs),
            "cpt50": cpt50,
            "cpt80": cpt80,
            "frontier": thin(front, max_points).points(),
            "static_frontier": static_frontier(c, costs).points(),
            "uniform": [
                {"tier": tiers[u.tier], "quality": u.quality, "cost": u.cost}
                for u in uniform_points(c, costs)
            ],
            "quality_floor": floor,
            "uniform_baseline": {
                "tier": tiers[baseline.tier],
                "quality": baseline.quality,
                "cost": baseline.cost,
            },
            "tuned_in_sample": tune(p, c, costs, alpha=alpha).as_dict(tiers),
            "pretest": pretest(p, c, costs).as_dict(),
        }
    )
    return doc


def _first_crossing(x: NDArray[np.float64], y: NDArray[np.float64], level: float) -> float | None:
    hit = np.flatnonzero(y >= level)
    if hit.size == 0:
        return None
    i = int(hit[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (x1 - x0) * (level - y0) / (y1 - y0))
