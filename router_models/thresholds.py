"""Thresholds from an accuracy floor (or a budget), judged against the honest baseline.

`tune` sweeps the one Lagrange multiplier of `frontier.routed_frontier` on validation labels and
picks the cheapest point whose quality meets the floor `alpha` (by default a fraction of the top
tier's uniform quality: alpha=0.97 means "97% of what the top tier scores"). It then compares
with the cheapest UNIFORM tier that meets the same floor (Paper A: savings a global precision
drop would give are not credited to routing). Unless routing saves at least `min_saving` of
that tier's cost, `tune` says so and returns thresholds that send everything to that tier, so
the result is never worse than the honest baseline on the validation data.

With a `budget` (mean relative cost per request) the dual is solved: the best quality whose
cost is within the budget, again against the best uniform tier within budget. With both, the
cheapest policy meeting the floor within the budget, or the budget's best if none does.

Re-exports the frontier helpers and the two-type pre-test so callers need one import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from router_models.frontier import (
    Frontier,
    UniformPoint,
    routed_frontier,
    static_frontier,
    thresholds_for,
    uniform_points,
)
from router_models.policy import uniform_thresholds
from router_models.pretest import PreTest, pretest

__all__ = [
    "Frontier",
    "PreTest",
    "TuneResult",
    "UniformPoint",
    "pretest",
    "quality_floor",
    "routed_frontier",
    "static_frontier",
    "tune",
    "uniform_baseline",
    "uniform_points",
]


@dataclass(frozen=True)
class TuneResult:
    """Thresholds (one per non-top tier) and what they do on the validation data."""

    thresholds: tuple[float, ...]
    expected_cost: float
    expected_quality: float
    lam: float | None  # the multiplier, None when the uniform fallback was returned
    routing_pays: bool
    feasible: bool  # the floor (and budget) can be met at all
    floor: float | None
    budget: float | None
    baseline: UniformPoint
    saving: float  # baseline cost minus expected cost (>= 0 by construction)
    message: str
    shares: tuple[float, ...] = field(default=())  # share of requests per tier

    def as_dict(self, tiers: Sequence[str]) -> dict[str, object]:
        return {
            "thresholds": dict(zip(tiers[:-1], self.thresholds, strict=True)),
            "expected_cost": self.expected_cost,
            "expected_quality": self.expected_quality,
            "lambda": self.lam,
            "routing_pays": self.routing_pays,
            "feasible": self.feasible,
            "quality_floor": self.floor,
            "budget": self.budget,
            "uniform_baseline": {
                "tier": tiers[self.baseline.tier],
                "quality": self.baseline.quality,
                "cost": self.baseline.cost,
            },
            "saving_vs_uniform": self.saving,
            "shares": dict(zip(tiers, self.shares, strict=True)),
            "message": self.message,
        }


def quality_floor(correct: ArrayLike, alpha: float, relative: bool = True) -> float:
    """`alpha` times the top tier's uniform quality (relative) or `alpha` itself (absolute)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must lie in [0, 1]")
    if not relative:
        return alpha
    c = np.asarray(correct, dtype=np.float64)
    return float(alpha * c[:, -1].mean())


def uniform_baseline(
    correct: ArrayLike, costs: Sequence[float], floor: float
) -> tuple[UniformPoint, bool]:
    """Cheapest uniform tier meeting `floor`; (best-quality tier, False) when none does."""
    points = uniform_points(correct, costs)
    meeting = [p for p in points if p.quality >= floor - 1e-12]
    if meeting:
        return min(meeting, key=lambda p: p.cost), True
    return max(points, key=lambda p: (p.quality, -p.cost)), False


def tune(
    proba: ArrayLike,
    correct: ArrayLike,
    costs: Sequence[float],
    alpha: float | None = None,
    budget: float | None = None,
    *,
    relative: bool = True,
    min_saving: float = 0.02,
) -> TuneResult:
    """Thresholds meeting `alpha` at least cost (or best quality within `budget`); module doc."""
    if alpha is None and budget is None:
        raise ValueError("give an accuracy floor alpha, a budget, or both")
    p = np.asarray(proba, dtype=np.float64)
    c = np.asarray(correct, dtype=np.float64)
    front = routed_frontier(p, c, costs)
    floor = quality_floor(c, alpha, relative) if alpha is not None else None
    points = uniform_points(c, costs)
    if floor is not None:
        baseline, feasible = uniform_baseline(c, costs, floor)
    else:
        baseline, feasible = _best_uniform_within(points, budget)
    candidates = np.ones(front.cost.shape[0], dtype=bool)
    if budget is not None:
        candidates &= front.cost <= budget + 1e-12
        if baseline.cost > budget + 1e-12:
            feasible = False
            baseline = _best_uniform_within(points, budget)[0]
    if floor is not None:
        meets = candidates & (front.quality >= floor - 1e-12)
        if meets.any():
            pick = int(np.flatnonzero(meets)[0])  # ascending cost: the first is the cheapest
        elif candidates.any():
            feasible = False
            pick = int(np.flatnonzero(candidates)[np.argmax(front.quality[candidates])])
        else:
            pick = -1
    else:
        pick = int(np.flatnonzero(candidates)[np.argmax(front.quality[candidates])]) if (
            candidates.any()
        ) else -1
    if pick < 0:
        return _fallback(baseline, c, costs, floor, budget, False, "no routed policy fits")
    cost, quality = float(front.cost[pick]), float(front.quality[pick])
    if floor is not None:
        pays = cost <= baseline.cost * (1.0 - min_saving) and quality >= floor - 1e-12
        judged = f"cost {cost:.4f} vs uniform {baseline.cost:.4f} at the floor {floor:.4f}"
    else:
        pays = quality > baseline.quality + 1e-12 and cost <= baseline.cost * (1.0 - min_saving) or (
            quality >= baseline.quality + 0.005 and cost <= baseline.cost + 1e-12
        )
        judged = f"quality {quality:.4f} vs uniform {baseline.quality:.4f} within the budget"
    if not pays:
        return _fallback(
            baseline,
            c,
            costs,
            floor,
            budget,
            feasible,
            f"routing does not beat the uniform tier on validation ({judged}); "
            "returning thresholds that send everything to that tier",
        )
    thresholds = thresholds_for(float(front.lam[pick]), costs)
    return TuneResult(
        thresholds=thresholds,
        expected_cost=cost,
        expected_quality=quality,
        lam=float(front.lam[pick]),
        routing_pays=True,
        feasible=feasible,
        floor=floor,
        budget=budget,
        baseline=baseline,
        saving=max(0.0, baseline.cost - cost),
        message=f"routing pays: {judged}",
        shares=_shares(p, thresholds),
    )


def _best_uniform_within(
    points: Sequence[UniformPoint], budget: float | None
) -> tuple[UniformPoint, bool]:
    fitting = [pt for pt in points if budget is None or pt.cost <= budget + 1e-12]
    if not fitting:
        return points[0], False
    return max(fitting, key=lambda pt: (pt.quality, -pt.cost)), True


def _fallback(
    baseline: UniformPoint,
    correct: np.ndarray,  # type: ignore[type-arg]
    costs: Sequence[float],
    floor: float | None,
    budget: float | None,
    feasible: bool,
    message: str,
) -> TuneResult:
    k = len(costs)
    shares = tuple(1.0 if t == baseline.tier else 0.0 for t in range(k))
    return TuneResult(
        thresholds=uniform_thresholds(baseline.tier, k),
        expected_cost=baseline.cost,
        expected_quality=baseline.quality,
        lam=None,
        routing_pays=False,
        feasible=feasible,
        floor=floor,
        budget=budget,
        baseline=baseline,
        saving=0.0,
        message=message,
        shares=shares,
    )


def _shares(proba: np.ndarray, thresholds: Sequence[float]) -> tuple[float, ...]:  # type: ignore[type-arg]
    k = proba.shape[1]
    t = np.asarray(thresholds, dtype=np.float64)
    accepted = proba[:, :-1] >= t
    chosen = np.where(accepted.any(axis=1), accepted.argmax(axis=1), k - 1)
    counts = np.bincount(chosen, minlength=k)
    return tuple(float(x) / proba.shape[0] for x in counts)
