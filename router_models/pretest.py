"""Paper A's two-type pre-test: is the traffic heterogeneous enough for routing to pay?

Model: a share p of requests is easy (the cheapest tier loses eps accuracy against the top tier
on them), the rest hard (it loses delta > eps). Routing sends hard requests up first, so the
routed frontier has one kink and the largest cost saving over a static random split is

    dC* = p (1 - p) (delta - eps) / (p eps + (1 - p) delta) * dc,    dc = c_top - c_cheapest,

reached at the kink; it vanishes when p -> 0 or 1 (homogeneous traffic) or delta -> eps.

Fitting on labelled data: the router's calibrated risk `r = p_top - p_cheapest` splits the
requests into two groups by exact one-dimensional 2-means (the split never looks at the
labels, so eps and delta measured inside the groups are not selected to look good); p is the
low-risk group's share, eps and delta the mean measured loss `correct_top - correct_cheapest`
in each group (a negative mean loss counts as 0 in the formula). The measured saving beside it
is what that very policy (hard group on the top tier, easy group on the cheapest) saves on the
data against the static split of the same quality: `static_cost(q_kink) - cost_kink`, with a
95% bootstrap interval over requests. It can be negative (routing that hurts), and it is noisy
when the two tiers' qualities are close, which is what the interval shows. For K > 2 the test is
run between the cheapest and the top tier. Routing is judged to pay when the predicted saving is
at least `min_saving` of dc and the measured saving's interval lies above zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["PreTest", "pretest", "split_two_types", "two_type_saving"]


@dataclass(frozen=True)
class PreTest:
    p: float
    eps: float
    delta: float
    dc: float
    predicted_saving: float
    measured_saving: float
    measured_ci: tuple[float, float]
    routing_pays: bool
    message: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def two_type_saving(p: float, eps: float, delta: float, dc: float) -> float:
    """Closed-form dC* (module doc); 0 when the types do not differ."""
    e, d = max(eps, 0.0), max(delta, 0.0)
    if not 0.0 < p < 1.0 or d <= e:
        return 0.0
    return p * (1.0 - p) * (d - e) / (p * e + (1.0 - p) * d) * dc


def split_two_types(risk: ArrayLike) -> NDArray[np.bool_]:
    """Boolean mask of the low-risk ("easy") group from exact 1-D 2-means on `risk`."""
    r = np.asarray(risk, dtype=np.float64).reshape(-1)
    n = r.shape[0]
    order = np.argsort(r, kind="stable")
    s = r[order]
    easy = np.zeros(n, dtype=bool)
    # Candidate cuts lie between distinct values, so tied requests stay in one group.
    cuts = np.flatnonzero(np.diff(s) > 0) + 1
    if cuts.size == 0:
        easy[:] = True
        return easy
    c1 = np.cumsum(s)
    c2 = np.cumsum(s * s)
    left_n = cuts.astype(np.float64)
    right_n = n - left_n
    left_sse = c2[cuts - 1] - c1[cuts - 1] ** 2 / left_n
    right_sse = (c2[-1] - c2[cuts - 1]) - (c1[-1] - c1[cuts - 1]) ** 2 / right_n
    best = int(cuts[np.argmin(left_sse + right_sse)])
    easy[order[:best]] = True
    return easy


def pretest(
    proba: ArrayLike,
    correct: ArrayLike,
    costs: Sequence[float],
    *,
    min_saving: float = 0.02,
    n_boot: int = 400,
    seed: int = 0,
) -> PreTest:
    """Fit the two-type model between the cheapest and top tier; see module doc."""
    prob = np.asarray(proba, dtype=np.float64)
    c = np.asarray(correct, dtype=np.float64)
    pair_p = prob[:, [0, -1]]
    pair_c = c[:, [0, -1]]
    pair_costs = (float(costs[0]), float(costs[-1]))
    dc = pair_costs[1] - pair_costs[0]
    easy = split_two_types(pair_p[:, 1] - pair_p[:, 0])
    loss = pair_c[:, 1] - pair_c[:, 0]
    share = float(easy.mean())
    eps = float(loss[easy].mean()) if easy.any() else 0.0
    delta = float(loss[~easy].mean()) if (~easy).any() else 0.0
    predicted = two_type_saving(share, eps, delta, dc)
    weights = np.ones((1, pair_c.shape[0]))
    measured = float(_kink_saving(weights, pair_c, easy, dc)[0])
    rng = np.random.default_rng(seed)
    boot = rng.multinomial(
        pair_c.shape[0], np.full(pair_c.shape[0], 1.0 / pair_c.shape[0]), size=n_boot
    )
    draws = _kink_saving(boot.astype(np.float64), pair_c, easy, dc)
    draws = draws[np.isfinite(draws)]
    low, high = (
        (float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975)))
        if draws.size
        else (float("nan"), float("nan"))
    )
    pays = predicted >= min_saving * dc and low > 0.0
    verdict = "routing pays" if pays else "routing does not pay"
    message = (
        f"{verdict}: predicted saving {predicted:.4f}, measured {measured:.4f} "
        f"(95% CI {low:.4f} to {high:.4f}; cost gap {dc:g}, threshold {min_saving:.0%} of it); "
        f"easy share {share:.3f}, loss easy {eps:.4f}, hard {delta:.4f}"
    )
    return PreTest(share, eps, delta, dc, predicted, measured, (low, high), pays, message)


def _kink_saving(
    weights: NDArray[np.float64], correct: NDArray[np.float64], easy: NDArray[np.bool_], dc: float
) -> NDArray[np.float64]:
    """Per row of `weights` (request multiplicities): static cost minus routed cost at the kink.

    NaN where the top tier is no better than the cheapest (no static line to compare with).
    """
    total = weights.sum(axis=1)
    q0 = weights @ correct[:, 0] / total
    q1 = weights @ correct[:, 1] / total
    routed_q = weights @ np.where(easy, correct[:, 0], correct[:, 1]) / total
    hard_share = weights @ (~easy).astype(np.float64) / total
    gap = q1 - q0
    with np.errstate(divide="ignore", invalid="ignore"):
        # Outside [q0, q1] the static split's best answer is one of its ends.
        static_share = np.where(gap > 0, np.clip((routed_q - q0) / gap, 0.0, 1.0), np.nan)
    return np.asarray((static_share - hard_share) * dc, dtype=np.float64)
