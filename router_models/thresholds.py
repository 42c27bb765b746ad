"""Thresholds from an accuracy floor (or a budget), judged against the honest baseline.

`tune` sweeps the one Lagrange multiplier of `frontier.routed_frontier` on validation labels and
picks the cheapest point whose quality meets the floor `alpha` (by default a fraction of the top
tier's uniform quality: alpha=0.97 means "97% of what the top tier scores"). It then compares
with the cheapest UNIFORM tier that meets the same floor (Paper A: savings a global precision
drop would give are not credited to routing). Routing is kept only if it saves at least
`min_saving` of that tier's cost AND, with one-sided `confidence`, its quality is not below what
the floor allows against that tier: the lower bound of the paired per-request difference
`quality(routed) - quality(uniform)` (normal approximation; most requests get the same answer
from both, so the pairing makes the bound tight) must be at least `min(0, floor - q_uniform)`.
Otherwise `tune` says so and returns thresholds that send everything to that tier. Without the
paired check a frontier point that clears the floor by noise on a few hundred validation rows
is chosen and then falls below the uniform tier on new data (benchmarks/router_quality.py showed
exactly that on the 499-row Llama set).

With a `budget` (mean relative cost per request) the dual is solved: the best quality whose
cost is within the budget, against the best uniform tier within budget; routing must then add
at least `min_saving` of the cheapest-to-top quality gap, and the paired lower bound of the
difference must be above zero. With both, the cheapest policy meeting the floor within the
budget, or the budget's best if none does. When no uniform tier meets the floor within the
budget, a routed policy that meets it needs no saving over the best uniform tier within the
budget, only the paired bound against it.

Re-exports the frontier helpers and the two-type pre-test so callers need one import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

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

# Tolerance for comparing means that should be equal (floating-point sums of 0/1 scores).
_TOL = 1e-12

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
    meeting = [p for p in points if p.quality >= floor - _TOL]
    if meeting:
        return _cheapest(meeting), True
    return max(points, key=lambda p: (p.quality, -p.cost)), False


def _cheapest(points: Sequence[UniformPoint]) -> UniformPoint:
    """The cheapest point; among equally cheap tiers (nvfp4 and w4a16 read the same bytes)
    the better one, as on the static frontier: the first would give up quality for nothing."""
    return min(points, key=lambda pt: (pt.cost, -pt.quality))


def tune(
    proba: ArrayLike,
    correct: ArrayLike,
    costs: Sequence[float],
    alpha: float | None = None,
    budget: float | None = None,
    *,
    relative: bool = True,
    min_saving: float = 0.02,
    confidence: float | None = 0.95,
) -> TuneResult:
    """Thresholds meeting `alpha` at least cost (or best quality within `budget`); module doc.

    `confidence=None` judges on point estimates only.
    """
    if alpha is None and budget is None:
        raise ValueError("give an accuracy floor alpha, a budget, or both")
    p = np.asarray(proba, dtype=np.float64)
    c = np.asarray(correct, dtype=np.float64)
    points = uniform_points(c, costs)
    floor = quality_floor(c, alpha, relative) if alpha is not None else None
    baseline, feasible = _baseline(points, floor, budget)
    front = routed_frontier(p, c, costs, reference=baseline.tier)
    z = _z(confidence)
    slack = 0.0 if floor is None else min(0.0, floor - baseline.quality)
    lower = front.quality - baseline.quality - z * _paired_se(front, baseline.quality)
    pick, reachable = _pick(front, floor, budget, lower >= slack - _TOL)
    if pick is None:
        return _fallback(
            baseline,
            len(costs),
            floor=floor,
            budget=budget,
            feasible=feasible,
            message=_over_budget_message(budget, baseline),
        )
    cost, quality = float(front.cost[pick]), float(front.quality[pick])
    bound = float(lower[pick])
    if floor is not None and feasible and not reachable:
        # A uniform tier (one the routed frontier does not pass through, a middle one)
        # meets the floor within the budget and no routed policy does: that tier it is.
        pays = False
        judged = (
            f"no routed policy meets the floor {floor:.4f} within the budget; uniform tier "
            f"{baseline.tier} does at cost {baseline.cost:.4f}"
        )
    # A floor out of reach within a budget leaves the budget's best quality, judged as such.
    elif floor is not None and (reachable or budget is None):
        # A uniform tier below the floor (none meets it within the budget) is no cost
        # benchmark: a routed policy that meets the floor beats it at any cost in the budget.
        baseline_meets = baseline.quality >= floor - _TOL
        pays = (
            (cost <= baseline.cost * (1.0 - min_saving) or not baseline_meets)
            and quality >= floor - _TOL
            and bound >= slack - _TOL
        )
        compared = "at the floor" if baseline_meets else "below the floor"
        judged = (
            f"cost {cost:.4f} vs uniform {baseline.cost:.4f} {compared} {floor:.4f}; "
            f"paired lower bound of the quality difference {bound:+.4f}, allowed {slack:+.4f}"
        )
    else:
        # Dual: the quality bought must be at least min_saving of the cheapest-to-top gap.
        gap = max(points[-1].quality - points[0].quality, 0.0)
        pays = quality >= baseline.quality + max(min_saving * gap, 1e-9) and bound > 0.0
        judged = (
            f"quality {quality:.4f} vs uniform {baseline.quality:.4f} within the budget; "
            f"paired lower bound of the difference {bound:+.4f}"
        )
        if floor is not None:
            judged = f"the floor {floor:.4f} is out of reach within the budget; {judged}"
    if not pays:
        message = (
            f"routing does not beat the uniform tier on validation ({judged}); "
            "returning thresholds that send everything to that tier"
        )
        return _fallback(
            baseline, len(costs), floor=floor, budget=budget, feasible=feasible, message=message
        )
    thresholds = thresholds_for(float(front.lam[pick]), costs)
    return TuneResult(
        thresholds=thresholds,
        expected_cost=cost,
        expected_quality=quality,
        lam=float(front.lam[pick]),
        routing_pays=True,
        # Whether the routed policy meets the floor (when there is one) within the budget.
        feasible=reachable,
        floor=floor,
        budget=budget,
        baseline=baseline,
        saving=max(0.0, baseline.cost - cost),
        message=f"routing pays: {judged}",
        shares=_shares(p, thresholds),
    )


def _baseline(
    points: Sequence[UniformPoint], floor: float | None, budget: float | None
) -> tuple[UniformPoint, bool]:
    """The honest uniform comparison: cheapest meeting the floor, else best within budget."""
    if floor is not None:
        meeting = [pt for pt in points if pt.quality >= floor - _TOL]
        if meeting and (budget is None or min(pt.cost for pt in meeting) <= budget + _TOL):
            return _cheapest(meeting), True
        if budget is None:
            return max(points, key=lambda pt: (pt.quality, -pt.cost)), False
        return _best_uniform_within(points, budget)[0], False
    return _best_uniform_within(points, budget)


def _pick(
    front: Frontier, floor: float | None, budget: float | None, trusted: NDArray[np.bool_]
) -> tuple[int | None, bool]:
    """Index of the chosen frontier point and whether it meets the floor.

    With a floor: the cheapest point meeting it whose paired bound is `trusted`, else the
    cheapest meeting it at all (then judged and refused by the caller).
    """
    candidates = np.ones(front.cost.shape[0], dtype=bool)
    if budget is not None:
        candidates &= front.cost <= budget + _TOL
    if not candidates.any():
        return None, False
    if floor is not None:
        meets = candidates & (front.quality >= floor - _TOL)
        if (meets & trusted).any():
            return int(np.flatnonzero(meets & trusted)[0]), True  # ascending cost: cheapest
        if meets.any():
            return int(np.flatnonzero(meets)[0]), True
    best = np.flatnonzero(candidates)[np.argmax(front.quality[candidates])]
    return int(best), floor is None


def _z(confidence: float | None) -> float:
    """One-sided normal quantile; 0 when no confidence is asked for."""
    if confidence is None or confidence <= 0.5:
        return 0.0
    if confidence >= 1.0:
        raise ValueError("confidence must be below 1")
    return float(NormalDist().inv_cdf(confidence))


def _paired_se(front: Frontier, reference_quality: float) -> NDArray[np.float64]:
    """Standard error of the mean paired difference against the reference tier, per point."""
    assert front.paired_sq is not None
    mean = front.quality - reference_quality
    var = np.maximum(front.paired_sq - mean**2, 0.0)
    return np.asarray(np.sqrt(var / max(front.n - 1, 1)), dtype=np.float64)


def _best_uniform_within(
    points: Sequence[UniformPoint], budget: float | None
) -> tuple[UniformPoint, bool]:
    fitting = [pt for pt in points if budget is None or pt.cost <= budget + _TOL]
    if not fitting:
        return points[0], False
    return max(fitting, key=lambda pt: (pt.quality, -pt.cost)), True


def _over_budget_message(budget: float | None, cheapest: UniformPoint) -> str:
    """Why nothing fits: only a budget below every tier's cost leaves no policy to pick, and
    the tier returned then costs more than the budget, which the message must say."""
    return (
        f"no policy fits the budget {budget}: the cheapest tier costs {cheapest.cost:.4f}; "
        f"returning thresholds that send everything to tier {cheapest.tier}, over the budget"
    )


def _fallback(
    baseline: UniformPoint,
    n_tiers: int,
    *,
    floor: float | None,
    budget: float | None,
    feasible: bool,
    message: str,
) -> TuneResult:
    shares = tuple(1.0 if t == baseline.tier else 0.0 for t in range(n_tiers))
    return TuneResult(
        thresholds=uniform_thresholds(baseline.tier, n_tiers),
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


def _shares(proba: NDArray[np.float64], thresholds: Sequence[float]) -> tuple[float, ...]:
    k = proba.shape[1]
    t = np.asarray(thresholds, dtype=np.float64)
    accepted = proba[:, :-1] >= t
    chosen = np.where(accepted.any(axis=1), accepted.argmax(axis=1), k - 1)
    counts = np.bincount(chosen, minlength=k)
    return tuple(float(x) / proba.shape[0] for x in counts)
