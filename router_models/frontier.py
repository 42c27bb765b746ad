"""Cost-quality frontiers on labelled data: routed (one Lagrange multiplier), static and uniform.

Quality is the mean score of the tier each request is sent to; cost the mean relative cost.

Routed frontier. For a price `lam` of one unit of cost in quality units, the thresholds are
`t_k = 1 - lam * (c_top - c_k)`: tier k is accepted when its calibrated risk of being worse
than the top tier, `1 - p_k`, is at most `lam` times the cost it saves; the request goes to the
cheapest accepted tier (`policy.decide`). Tier k becomes acceptable for request i once
`lam >= mu_ik = (1 - p_ik) / (c_top - c_k)`, so sweeping `lam` from 0 (everything on the top
tier) to infinity (everything on the cheapest) changes a request's tier only at its `mu_ik`.
Sorting those K-1 events per request gives the exact frontier in O(nK log nK): one point per
distinct `lam` (requests with equal probabilities move together, so ties are one step).

Static frontier: a fixed random share of traffic per tier, blind to the request; the upper
concave hull of the uniform points (cost_k, quality_k), flat from its best point up to the top
tier's cost when a cheaper tier scores best. Paper A: the routed frontier is never
below it when the probabilities rank requests correctly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "Frontier",
    "UniformPoint",
    "routed_frontier",
    "saves_on_next",
    "static_frontier",
    "thin",
    "thresholds_for",
    "uniform_points",
]


@dataclass(frozen=True)
class Frontier:
    """Points ordered by increasing cost; `lam` is the multiplier that produces each point."""

    cost: NDArray[np.float64]
    quality: NDArray[np.float64]
    lam: NDArray[np.float64]
    paired_sq: NDArray[np.float64] | None = None  # see routed_frontier(reference=...)
    n: int = 0  # requests behind the points

    def points(self) -> list[dict[str, float]]:
        return [
            {"cost": float(c), "quality": float(q)}
            for c, q in zip(self.cost, self.quality, strict=True)
        ]

    def cost_at(self, quality: float) -> float:
        """Least cost on the piecewise-linear frontier reaching `quality` (inf if none)."""
        ok = np.flatnonzero(self.quality >= quality)
        if ok.size == 0:
            return float("inf")
        first = int(ok[0])
        if first == 0:
            return float(self.cost[0])
        c0, c1 = self.cost[first - 1], self.cost[first]
        q0, q1 = self.quality[first - 1], self.quality[first]
        return float(c0 + (c1 - c0) * (quality - q0) / (q1 - q0))


@dataclass(frozen=True)
class UniformPoint:
    """Everything on one tier."""

    tier: int
    cost: float
    quality: float


def thresholds_for(lam: float, costs: Sequence[float]) -> tuple[float, ...]:
    """The K-1 thresholds of multiplier `lam`, clipped to [0, 1].

    `routed_frontier` computes each request's multiplier as the least float `lam` at which this
    very arithmetic accepts it, so its points are exactly what `policy.decide` does with these.
    """
    top = costs[-1]
    return tuple(
        min(1.0, max(0.0, 1.0 - lam * (top - c))) if saves else 1.0
        for c, saves in zip(costs[:-1], saves_on_next(costs), strict=True)
    )


def saves_on_next(costs: Sequence[float]) -> list[bool]:
    """Per non-top tier: whether it is cheaper than the next tier up. One that costs the same
    (nvfp4 and w4a16 read the same bytes) is never worth taking: the next tier's probability
    is at least its own (calibration is monotone along the ladder) at no extra cost, and the
    cheapest accepted tier would otherwise win the tie and give quality away for nothing."""
    return [cheaper < dearer for cheaper, dearer in pairwise(costs)]


def uniform_points(correct: ArrayLike, costs: Sequence[float]) -> list[UniformPoint]:
    c = _complete(correct, costs)
    quality = c.mean(axis=0)
    return [UniformPoint(k, float(costs[k]), float(quality[k])) for k in range(len(costs))]


def static_frontier(correct: ArrayLike, costs: Sequence[float]) -> Frontier:
    """Upper concave hull of the uniform points, from the cheapest tier up."""
    pts = uniform_points(correct, costs)
    best: dict[float, UniformPoint] = {}
    for p in pts:  # at equal cost only the better tier can be on the hull
        if p.cost not in best or p.quality > best[p.cost].quality:
            best[p.cost] = p
    ordered = [best[c] for c in sorted(best)]
    hull: list[UniformPoint] = [ordered[0]]
    for p in ordered[1:]:
        if p.quality <= hull[-1].quality:
            continue  # dearer and no better: never worth mixing in
        while len(hull) >= 2 and _slope(hull[-2], hull[-1]) <= _slope(hull[-2], p):
            hull.pop()
        hull.append(p)
    if hull[-1].cost < pts[-1].cost:
        # Spending more never has to buy less: the frontier stays flat up to the top tier's cost.
        hull.append(UniformPoint(hull[-1].tier, pts[-1].cost, hull[-1].quality))
    return Frontier(
        cost=np.array([p.cost for p in hull]),
        quality=np.array([p.quality for p in hull]),
        lam=np.full(len(hull), np.nan),
    )


def routed_frontier(
    proba: ArrayLike,
    correct: ArrayLike,
    costs: Sequence[float],
    reference: int | None = None,
) -> Frontier:
    """The exact frontier of the one-multiplier threshold family (module doc).

    With `reference`, each point also carries the mean squared per-request quality difference
    against sending everything to that tier (`Frontier.paired_sq`), for paired intervals.
    """
    c = _complete(correct, costs)
    p = np.asarray(proba, dtype=np.float64)
    n, k_tiers = c.shape
    if p.shape != c.shape:
        raise ValueError(f"proba has shape {p.shape}, correct {c.shape}")
    cost = np.asarray(costs, dtype=np.float64)
    gap = np.where(saves_on_next(costs), cost[-1] - cost[:-1], 0.0)
    # (n, K-1): multiplier at which tier k becomes acceptable; never when it saves nothing
    # against the next tier up.
    mu = _acceptance_multipliers(p[:, :-1], gap)
    flat = mu.reshape(-1)
    order = np.argsort(flat, kind="stable")
    # Plain lists: the event loop below indexes scalars, which numpy does slowly.
    rows = (order // (k_tiers - 1)).tolist()
    tiers = (order % (k_tiers - 1)).tolist()
    lams = flat[order].tolist()
    table = c.tolist()
    cost_list = cost.tolist()
    current = [k_tiers - 1] * n
    total_cost = cost_list[-1] * n
    total_quality = float(c[:, -1].sum())
    total_sq = 0.0 if reference is None else float(((c[:, -1] - c[:, reference]) ** 2).sum())
    out_cost = [total_cost / n]
    out_quality = [total_quality / n]
    out_lam = [0.0]
    out_sq = [total_sq / n]
    i, m = 0, len(lams)
    while i < m and math.isfinite(lams[i]):
        lam = lams[i]
        while i < m and lams[i] == lam:
            r, t = rows[i], tiers[i]
            was = current[r]
            if t < was:
                row = table[r]
                total_cost += cost_list[t] - cost_list[was]
                total_quality += row[t] - row[was]
                if reference is not None:
                    base = row[reference]
                    total_sq += (row[t] - base) ** 2 - (row[was] - base) ** 2
                current[r] = t
            i += 1
        out_cost.append(total_cost / n)
        out_quality.append(total_quality / n)
        out_lam.append(lam)
        out_sq.append(total_sq / n)
    # Ascending cost: reverse the sweep (it ran from the top tier down).
    return Frontier(
        cost=np.asarray(out_cost[::-1]),
        quality=np.asarray(out_quality[::-1]),
        lam=np.asarray(out_lam[::-1]),
        paired_sq=None if reference is None else np.asarray(out_sq[::-1]),
        n=n,
    )


def thin(frontier: Frontier, max_points: int = 101) -> Frontier:
    """At most `max_points` points, evenly spread over cost, always keeping both ends."""
    n = frontier.cost.shape[0]
    if n <= max_points:
        return frontier
    grid = np.linspace(frontier.cost[0], frontier.cost[-1], max_points)
    idx = np.unique(np.clip(np.searchsorted(frontier.cost, grid), 0, n - 1))
    idx = np.unique(np.r_[0, idx, n - 1])
    sq = None if frontier.paired_sq is None else frontier.paired_sq[idx]
    return Frontier(frontier.cost[idx], frontier.quality[idx], frontier.lam[idx], sq, frontier.n)


def _acceptance_multipliers(
    proba: NDArray[np.float64], gap: NDArray[np.float64]
) -> NDArray[np.float64]:
    """(n, K-1): the least float `lam` with `proba >= 1 - lam * gap`; inf when `gap` is 0.

    `(1 - p) / gap` is that value in exact arithmetic, but rounding puts it an ulp or two
    either side: (1 - 0.7) / 0.3 and (1 - 0.8) / 0.2 round to either side of 1. Then the sweep
    and `thresholds_for` disagree about which requests one `lam` accepts, and `tune` reports a
    point whose thresholds do something cheaper and worse, below the floor. `1 - lam * gap`
    is monotone in `lam` in floating point too, so stepping by ulps finds the exact value.
    """
    gaps = np.broadcast_to(gap, proba.shape)
    mu = np.full(proba.shape, np.inf)
    np.divide(1.0 - proba, gaps, out=mu, where=gaps > 0)
    finite = np.isfinite(mu)
    p, g = proba[finite], gaps[finite]
    m = mu[finite]
    for _ in range(64):  # up while the thresholds still refuse the request
        refused = p < 1.0 - m * g
        if not refused.any():
            break
        m[refused] = np.nextafter(m[refused], np.inf)
    for _ in range(64):  # down while one ulp less is still accepted
        below = np.nextafter(m, -np.inf)
        lower = (below >= 0.0) & (p >= 1.0 - below * g)
        if not lower.any():
            break
        m[lower] = below[lower]
    mu[finite] = np.maximum(m, 0.0)
    return mu


def _complete(correct: ArrayLike, costs: Sequence[float]) -> NDArray[np.float64]:
    c = np.asarray(correct, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != len(costs):
        raise ValueError(f"correct must have shape (n, {len(costs)})")
    if c.shape[0] == 0:
        raise ValueError("no rows")
    if np.isnan(c).any():
        raise ValueError("frontiers need every tier's score on every row (found NaN)")
    return c


def _slope(a: UniformPoint, b: UniformPoint) -> float:
    return (b.quality - a.quality) / (b.cost - a.cost)
