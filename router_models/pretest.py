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
in each group (a negative mean loss counts as 0 in the formula; when the top tier is no more
accurate than the cheapest overall, the predicted saving is 0). On the data it was fitted on,
the kink policy (hard group up, easy group down) saves exactly dC* against the static split (it
is a point of the router's curve, and the formula is that point's algebra), so the predicted
saving gets a 95% bootstrap interval over requests instead, which is what says whether the
saving is real or noise.

The measured saving beside it is read off the router's whole cost-quality curve (requests sent
up in order of risk, ties together): the largest cost gap, at equal quality, between the static
split and the curve, with its own bootstrap interval. It is at least the kink's saving on the
same data, so it shows how much the two-type picture leaves out; being a maximum over many
points it leans optimistic on small sets. For K > 2 the test is run between the cheapest tier
routing may use (the last of equally cheap ones) and the top tier. Routing is judged to pay
when the predicted saving is at least `min_saving` of dc and its interval lies above zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from router_models.frontier import saves_on_next

__all__ = ["PreTest", "pretest", "split_two_types", "two_type_saving"]


@dataclass(frozen=True)
class PreTest:
    p: float
    eps: float
    delta: float
    dc: float
    predicted_saving: float
    predicted_ci: tuple[float, float]
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
    """Fit the two-type model between the cheapest tier routing may use and the top tier; see
    module doc. A tier that costs the same as the next one up is never routed to (that one is
    at least as likely adequate at no extra cost): the pair starts at the last of the equally
    cheapest tiers."""
    prob = np.asarray(proba, dtype=np.float64)
    c = np.asarray(correct, dtype=np.float64)
    low = next((tier for tier, saves in enumerate(saves_on_next(costs)) if saves), 0)
    pair_p = prob[:, [low, -1]]
    pair_c = c[:, [low, -1]]
    pair_costs = (float(costs[low]), float(costs[-1]))
    dc = pair_costs[1] - pair_costs[0]
    easy = split_two_types(pair_p[:, 1] - pair_p[:, 0])
    loss = pair_c[:, 1] - pair_c[:, 0]
    share = float(easy.mean())
    eps = float(loss[easy].mean()) if easy.any() else 0.0
    delta = float(loss[~easy].mean()) if (~easy).any() else 0.0
    predicted = two_type_saving(share, eps, delta, dc)
    risk = pair_p[:, 1] - pair_p[:, 0]
    hard = (~easy).astype(np.float64)
    n = pair_c.shape[0]
    _, measured = (float(x[0]) for x in _curve_savings(np.ones((1, n)), pair_c, risk, hard, dc))
    rng = np.random.default_rng(seed)
    boot = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)
    kink_draws, max_draws = _curve_savings(boot, pair_c, risk, hard, dc)
    predicted_ci, measured_ci = _interval(kink_draws), _interval(max_draws)
    if not np.isfinite(measured):  # no point of the curve at a static split's quality
        measured_ci = (float("nan"), float("nan"))
    top_gain = float(loss.mean()) if n else 0.0
    verdict = "routing does not pay"
    if top_gain <= 0.0:
        # The cheapest tier is at least as accurate overall: there is nothing to buy by
        # sending requests up, whatever the groups' losses (a negative eps clipped to 0 would
        # otherwise predict a saving of p * dc).
        predicted, predicted_ci = 0.0, (0.0, 0.0)
        verdict += f" (the top tier is no more accurate than the cheapest: {top_gain:+.4f})"
    pays = predicted >= min_saving * dc and predicted_ci[0] > 0.0
    if pays:
        verdict = "routing pays"
    largest = (
        f"largest measured {measured:.4f} (95% CI {measured_ci[0]:.4f} to {measured_ci[1]:.4f})"
        if np.isfinite(measured)
        else "largest measured: none (no point of the curve reaches a static split's quality)"
    )
    message = (
        f"{verdict}: predicted saving {predicted:.4f} (95% CI {predicted_ci[0]:.4f} to "
        f"{predicted_ci[1]:.4f}), {largest}; cost gap {dc:g}, threshold {min_saving:.0%} of it; "
        f"easy share {share:.3f}, loss easy {eps:.4f}, hard {delta:.4f}"
    )
    return PreTest(
        share, eps, delta, dc, predicted, predicted_ci, measured, measured_ci, pays, message
    )


def _interval(draws: NDArray[np.float64]) -> tuple[float, float]:
    finite = draws[np.isfinite(draws)]
    if not finite.size:
        return (float("nan"), float("nan"))
    return (float(np.quantile(finite, 0.025)), float(np.quantile(finite, 0.975)))


def _curve_savings(
    weights: NDArray[np.float64],
    correct: NDArray[np.float64],
    risk: NDArray[np.float64],
    hard: NDArray[np.float64],
    dc: float,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per row of `weights` (request multiplicities), in cost units: the static split's cost
    minus the kink policy's (every hard request up, at the kink quality), and the largest such
    gap along the curve. NaN where the top tier is no better than the cheapest.

    The kink policy costs the hard share of dc: the curve's first point at the kink quality can
    be cheaper (the least risky hard requests may gain nothing), and saving against it is not
    the dC* whose interval this is.
    """
    total = weights.sum(axis=1)
    gain = correct[:, 1] - correct[:, 0]
    q0 = weights @ correct[:, 0] / total
    q1 = weights @ correct[:, 1] / total
    kink = q0 + weights @ (hard * gain) / total
    order = np.argsort(-risk, kind="stable")
    ends = np.r_[np.flatnonzero(np.diff(risk[order]) != 0), order.size - 1]  # tie groups
    w = weights[:, order]
    share = np.c_[np.zeros(len(total)), np.cumsum(w, axis=1)[:, ends] / total[:, None]]
    quality = np.c_[q0, q0[:, None] + np.cumsum(w * gain[order], axis=1)[:, ends] / total[:, None]]
    gap = (q1 - q0)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        static = np.where(gap > 0, np.clip((quality - q0[:, None]) / gap, 0.0, 1.0), np.nan)
        static_kink = np.where(gap[:, 0] > 0, np.clip((kink - q0) / gap[:, 0], 0.0, 1.0), np.nan)
    largest = np.max(static - share, axis=1) * dc
    routed = weights @ hard / total
    return (
        np.asarray((static_kink - routed) * dc, dtype=np.float64),
        np.asarray(largest, dtype=np.float64),
    )
