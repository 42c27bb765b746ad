"""Frontiers, tune and the two-type pre-test on synthetic data with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.frontier import routed_frontier, static_frontier, thresholds_for
from router_models.policy import decide
from router_models.pretest import pretest, split_two_types, two_type_saving
from router_models.thresholds import quality_floor, tune, uniform_baseline

COSTS = (0.25, 1.0)


def two_types(
    n: int, p: float, eps: float, delta: float, *, q_top: float = 0.9, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Correctness and the oracle's calibrated probabilities for the two-type model."""
    rng = np.random.default_rng(seed)
    easy = rng.random(n) < p
    top = (rng.random(n) < q_top).astype(float)
    loss = np.where(easy, eps, delta)
    cheap = np.where(rng.random(n) < loss, 0.0, top)
    # P(cheap >= top) for the type: it fails only where top is right.
    p_cheap = 1.0 - loss * q_top
    proba = np.column_stack([p_cheap, np.ones(n)])
    return proba, np.column_stack([cheap, top]), easy


def apply(proba: np.ndarray, correct: np.ndarray, costs, thresholds) -> tuple[float, float]:
    chosen = np.array([decide(row, thresholds) for row in proba])
    return float(np.asarray(costs)[chosen].mean()), float(
        correct[np.arange(len(chosen)), chosen].mean()
    )


def test_measured_saving_matches_closed_form() -> None:
    p, eps, delta, q_top = 0.7, 0.05, 0.5, 0.9
    proba, correct, _ = two_types(40_000, p, eps, delta, q_top=q_top)
    test = pretest(proba, correct, COSTS)
    expected = two_type_saving(p, eps * q_top, delta * q_top, COSTS[1] - COSTS[0])
    assert test.p == pytest.approx(p, abs=0.01)
    assert test.eps == pytest.approx(eps * q_top, abs=0.01)
    assert test.delta == pytest.approx(delta * q_top, abs=0.02)
    assert test.predicted_saving == pytest.approx(expected, abs=0.02)
    # Sampling error of the measured saving at n=40k is about 0.01 (its bootstrap interval).
    assert test.measured_saving == pytest.approx(expected, abs=0.03)
    low, high = test.measured_ci
    assert low <= expected <= high or abs(test.measured_saving - expected) < 0.01
    assert test.routing_pays


def test_homogeneous_traffic_predicts_no_saving() -> None:
    assert two_type_saving(0.0, 0.1, 0.5, 1.0) == 0.0
    assert two_type_saving(1.0, 0.1, 0.5, 1.0) == 0.0
    assert two_type_saving(0.5, 0.3, 0.3, 1.0) == 0.0
    proba, correct, _ = two_types(5000, 0.5, 0.2, 0.2)
    test = pretest(proba, correct, COSTS)
    assert test.predicted_saving < 0.02 and not test.routing_pays


def test_a_top_tier_no_better_than_the_cheapest_predicts_no_saving() -> None:
    """The easy group's loss is negative (the cheap tier wins there) and the hard group's
    small: overall the top tier is worse. Clipping eps to 0 alone would predict p * dc."""
    rng = np.random.default_rng(3)
    n = 4000
    easy = rng.random(n) < 0.6
    top = (rng.random(n) < 0.55).astype(float)
    cheap = top.copy()
    flip = rng.random(n) < np.where(easy, 0.10, 0.02)
    cheap[flip & easy & (top == 0)] = 1.0  # the cheap tier right where the top one is wrong
    cheap[flip & ~easy & (top == 1)] = 0.0
    proba = np.c_[np.where(easy, 0.9, 0.5), np.ones(n)]
    correct = np.c_[cheap, top]
    assert correct[:, 1].mean() < correct[:, 0].mean()
    test = pretest(proba, correct, COSTS)
    assert test.eps < 0.0 < test.delta
    assert test.predicted_saving == 0.0 and test.predicted_ci == (0.0, 0.0)
    assert not test.routing_pays and "no more accurate" in test.message
    assert np.isnan(test.measured_saving) == np.isnan(test.measured_ci[0])


def test_two_means_recovers_separated_groups() -> None:
    risk = np.r_[np.full(30, 0.1), np.full(70, 0.9)] + np.linspace(0, 0.01, 100)
    easy = split_two_types(risk)
    assert easy[:30].all() and not easy[30:].any()


def test_routed_frontier_is_concave_and_above_the_static_split() -> None:
    proba, correct, _ = two_types(20_000, 0.6, 0.05, 0.6)
    routed = routed_frontier(proba, correct, COSTS)
    static = static_frontier(correct, COSTS)
    slopes = np.diff(routed.quality) / np.diff(routed.cost)
    assert np.all(np.diff(slopes) <= 1e-9)  # concave: slopes fall as cost rises
    static_at = np.interp(routed.cost, static.cost, static.quality)
    assert np.all(routed.quality >= static_at - 1e-12)
    assert routed.cost[0] == pytest.approx(0.25) and routed.cost[-1] == pytest.approx(1.0)


def random_three_tiers(n: int) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float]]:
    """Random sorted probabilities (top tier 1) and correctness rising with the tier."""
    rng = np.random.default_rng(3)
    proba = np.sort(rng.random((n, 3)), axis=1)
    proba[:, -1] = 1.0
    correct = (rng.random((n, 3)) < [0.6, 0.7, 0.8]).astype(float)
    return proba, correct, (0.25, 0.5, 1.0)


def test_frontier_points_are_what_decide_does() -> None:
    proba, correct, costs = random_three_tiers(500)
    front = routed_frontier(proba, correct, costs)
    for i in range(0, len(front.lam), max(1, len(front.lam) // 25)):
        cost, quality = apply(proba, correct, costs, thresholds_for(front.lam[i], costs))
        assert cost == pytest.approx(front.cost[i], abs=1e-12)
        assert quality == pytest.approx(front.quality[i], abs=1e-12)


def test_tune_meets_the_floor_at_least_cost_and_beats_uniform() -> None:
    proba, correct, _ = two_types(20_000, 0.7, 0.02, 0.5)
    result = tune(proba, correct, COSTS, alpha=0.97)
    floor = quality_floor(correct, 0.97)
    assert result.routing_pays and result.feasible
    assert result.expected_quality >= floor
    assert result.expected_cost < result.baseline.cost
    cost, quality = apply(proba, correct, COSTS, result.thresholds)
    assert cost == pytest.approx(result.expected_cost, abs=1e-12)
    assert quality == pytest.approx(result.expected_quality, abs=1e-12)


def test_tune_falls_back_to_the_uniform_tier_when_routing_does_not_pay() -> None:
    rng = np.random.default_rng(5)
    n = 5000
    correct = (rng.random((n, 2)) < 0.8).astype(float)  # no structure to exploit
    proba = np.column_stack([rng.uniform(0.6, 0.9, n), np.ones(n)])  # an uninformative router
    result = tune(proba, correct, COSTS, alpha=0.99)
    baseline, _ = uniform_baseline(correct, COSTS, quality_floor(correct, 0.99))
    assert not result.routing_pays
    assert "does not beat the uniform tier" in result.message
    assert result.baseline == baseline
    cost, quality = apply(proba, correct, COSTS, result.thresholds)
    assert (cost, quality) == (pytest.approx(baseline.cost), pytest.approx(baseline.quality))


def test_cheapest_uniform_tier_meeting_the_floor() -> None:
    correct = np.array([[1, 1, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1]], dtype=float)
    baseline, ok = uniform_baseline(correct, (0.25, 0.5, 1.0), 0.75)
    assert ok and baseline.tier == 1 and baseline.quality == 0.75


def test_budget_maximises_quality_within_it() -> None:
    proba, correct, _ = two_types(20_000, 0.7, 0.02, 0.5)
    result = tune(proba, correct, COSTS, budget=0.5)
    assert result.expected_cost <= 0.5
    assert result.routing_pays
    assert result.expected_quality > correct[:, 0].mean() + 0.05


def test_a_budget_below_every_tier_says_the_answer_is_over_it() -> None:
    """Nothing costs 0.1 here: the cheapest tier comes back, and the message says it is over
    the budget (it used to say only "no routed policy fits")."""
    proba, correct, _ = two_types(2_000, 0.7, 0.02, 0.5)
    for alpha in (None, 0.9):
        result = tune(proba, correct, COSTS, alpha=alpha, budget=0.1)
        assert not result.routing_pays and not result.feasible
        assert result.expected_cost == 0.25 and result.thresholds == (0.0,)
        assert "budget 0.1" in result.message and "cheapest tier costs 0.2500" in result.message
        assert "over the budget" in result.message


def test_a_floor_out_of_reach_within_the_budget_leaves_the_budgets_best() -> None:
    """The floor (99% of the top tier) cannot be met for 0.5; the answer is then what the
    budget alone gives, not the cheap tier: a floor asked for must not make things worse."""
    proba, correct, _ = two_types(20_000, 0.7, 0.02, 0.5)
    budget_only = tune(proba, correct, COSTS, budget=0.5)
    both = tune(proba, correct, COSTS, alpha=0.99, budget=0.5)
    assert budget_only.routing_pays and both.routing_pays, both.message
    assert not both.feasible and "out of reach" in both.message
    assert both.thresholds == budget_only.thresholds
    assert both.expected_quality == budget_only.expected_quality
    assert both.expected_quality < both.floor


def test_floor_and_budget_route_when_no_uniform_tier_meets_both() -> None:
    """Within a budget of 0.5 only the cheap tier fits, and it misses the floor; routing the
    hard 30% to the top tier meets the floor within the budget, so that is the answer."""
    proba, correct, _ = two_types(20_000, 0.7, 0.02, 0.5)
    floor = quality_floor(correct, 0.97)
    assert correct[:, 0].mean() < floor
    result = tune(proba, correct, COSTS, alpha=0.97, budget=0.5)
    assert result.routing_pays and result.feasible, result.message
    assert result.baseline.tier == 0
    assert "below the floor" in result.message
    # Routing costs more than the cheap tier here; the reported saving is 0, not negative.
    assert result.expected_cost > result.baseline.cost and result.saving == 0.0
    cost, quality = apply(proba, correct, COSTS, result.thresholds)
    assert cost <= 0.5 and quality >= floor
    assert (cost, quality) == (
        pytest.approx(result.expected_cost),
        pytest.approx(result.expected_quality),
    )


def test_tune_needs_a_target() -> None:
    proba, correct, _ = two_types(100, 0.5, 0.1, 0.5)
    with pytest.raises(ValueError):
        tune(proba, correct, COSTS)


def test_a_lucky_validation_point_is_not_trusted() -> None:
    """An uninformative router on 400 rows: one frontier point clears the floor by chance.
    Judged on point estimates it looks like a saving; the paired bound refuses it."""
    rng = np.random.default_rng(0)
    n = 400
    top = (rng.random(n) < 0.6).astype(float)
    cheap = np.where(rng.random(n) < 0.08, 1 - top, top)
    correct = np.column_stack([cheap, top])
    proba = np.column_stack([rng.uniform(0.8, 0.99, n), np.ones(n)])
    naive = tune(proba, correct, COSTS, alpha=0.99, confidence=None)
    assert naive.routing_pays and naive.expected_cost < 0.8
    careful = tune(proba, correct, COSTS, alpha=0.99)
    assert not careful.routing_pays and careful.thresholds == (1.0,)


def test_frontier_points_are_what_decide_does_when_tiers_tie_up_to_rounding() -> None:
    # Probabilities on a 0.1 grid (small calibration sets give such block values): across
    # tiers, (1 - p) / gap meet in exact arithmetic (0.3 / 0.3 and 0.2 / 0.2 are both 1) but
    # not in floating point, and the thresholds must not merge what the sweep kept apart.
    rng = np.random.default_rng(5)
    proba = np.minimum(np.round(np.sort(rng.random((400, 4)), axis=1), 1), 0.9)
    proba[:, -1] = 1.0
    correct = (rng.random((400, 4)) < [0.5, 0.6, 0.7, 0.8]).astype(float)
    costs = (0.1, 0.2, 0.3, 0.4)
    front = routed_frontier(proba, correct, costs)
    for i in range(len(front.lam)):
        cost, quality = apply(proba, correct, costs, thresholds_for(front.lam[i], costs))
        assert cost == pytest.approx(front.cost[i], abs=1e-12)
        assert quality == pytest.approx(front.quality[i], abs=1e-12)
    result = tune(proba, correct, costs, alpha=0.9)
    assert result.routing_pays
    cost, quality = apply(proba, correct, costs, result.thresholds)
    assert quality == pytest.approx(result.expected_quality, abs=1e-12)
    assert quality >= quality_floor(correct, 0.9)


def test_a_budget_gain_too_small_against_the_quality_gap_is_not_routing() -> None:
    """Within a budget, routing must buy at least min_saving of the cheapest-to-top quality
    gap. Here the router knows 20 of 10,000 rows the top tier fixes (a real, significant
    gain of 0.002) while the gap is 0.152: 2 % of it is 0.003, so the cheap tier stays."""
    n = 10_000
    cheap, top = np.ones(n), np.ones(n)
    cheap[:1520] = 0.0  # the top tier fixes 1,520 rows ...
    proba = np.column_stack([np.full(n, 0.9), np.ones(n)])
    proba[:20, 0] = 0.0  # ... of which the router recognises 20
    correct = np.column_stack([cheap, top])
    budget = 0.25 + 21 / n * 0.75  # room for those 20 rows on the top tier
    refused = tune(proba, correct, COSTS, budget=budget)
    assert not refused.routing_pays and refused.thresholds == (0.0,)
    assert refused.baseline.tier == 0 and "does not beat the uniform tier" in refused.message
    accepted = tune(proba, correct, COSTS, budget=budget, min_saving=0.0)
    assert accepted.routing_pays and accepted.expected_quality == pytest.approx(0.85)


def test_a_budget_gain_within_noise_is_not_routing() -> None:
    """Both tiers score 0.97. The router's 100 rows hold 30 the top tier fixes and 25 it
    breaks: +0.005 on point estimates, a paired lower bound below zero at 95 %."""
    n = 1000
    cheap, top = np.ones(n), np.ones(n)
    cheap[:30] = 0.0
    top[30:55] = 0.0
    top[100:105] = 0.0  # outside the routed rows: the tiers' overall quality is equal
    proba = np.column_stack([np.full(n, 0.9), np.ones(n)])
    proba[:100, 0] = 0.1
    correct = np.column_stack([cheap, top])
    assert correct[:, 0].mean() == correct[:, 1].mean()
    naive = tune(proba, correct, COSTS, budget=0.325, confidence=None)
    assert naive.routing_pays and naive.expected_quality > 0.97
    careful = tune(proba, correct, COSTS, budget=0.325)
    assert not careful.routing_pays and careful.expected_cost == 0.25
    assert "paired lower bound of the difference -" in careful.message


def test_alpha_must_be_a_fraction() -> None:
    proba, correct, _ = two_types(100, 0.5, 0.1, 0.5)
    for alpha in (-0.1, 1.01):
        with pytest.raises(ValueError, match="alpha"):
            tune(proba, correct, COSTS, alpha=alpha)


def test_reported_shares_are_where_the_thresholds_send_requests() -> None:
    proba, correct, costs = random_three_tiers(2000)
    result = tune(proba, correct, costs, alpha=0.9, confidence=None)
    assert result.routing_pays
    chosen = np.array([decide(row, result.thresholds) for row in proba])
    expected = np.bincount(chosen, minlength=3) / len(chosen)
    assert result.shares == pytest.approx(tuple(expected), abs=1e-12)
    assert 0.0 < result.shares[0] < 1.0 and sum(result.shares) == pytest.approx(1.0)


def test_thresholds_stay_probabilities_for_any_multiplier() -> None:
    """Tuned thresholds are written to tenant configs, which hold probabilities."""
    costs = (0.25, 0.5, 1.0)
    assert thresholds_for(0.0, costs) == (1.0, 1.0)
    assert thresholds_for(1e6, costs) == (0.0, 0.0)
    assert all(0.0 <= t <= 1.0 for lam in (0.1, 1.0, 3.0, 10.0) for t in thresholds_for(lam, costs))


def test_static_frontier_stays_flat_up_to_the_top_tiers_cost() -> None:
    """When a cheaper tier scores best, spending more buys nothing, but the static frontier
    still spans the whole cost range (PGR curves integrate over it)."""
    correct = np.array([[1, 1, 0], [1, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=float)
    static = static_frontier(correct, (0.25, 0.5, 1.0))
    assert static.cost.tolist() == [0.25, 1.0]
    assert static.quality.tolist() == [0.75, 0.75]


def test_the_pretest_threshold_is_a_share_of_the_cost_gap() -> None:
    """min_saving is relative to the cost gap: a saving of 0.32 on a gap of 3 is 11 %."""
    proba, correct, _ = two_types(20_000, 0.5, 0.10, 0.16)
    costs = (1.0, 4.0)
    test = pretest(proba, correct, costs, min_saving=0.10)
    assert 0.3 < test.predicted_saving < 0.4 and test.predicted_ci[0] > 0.0
    assert test.routing_pays
    assert not pretest(proba, correct, costs, min_saving=0.2).routing_pays


def test_the_pretest_needs_a_saving_its_interval_excludes_zero() -> None:
    """On 100 rows the predicted saving clears the threshold but its bootstrap interval
    reaches below zero: not evidence enough."""
    proba, correct, _ = two_types(100, 0.7, 0.05, 0.3, seed=2)
    test = pretest(proba, correct, COSTS)
    assert test.predicted_saving > 0.02 * 0.75 and test.predicted_ci[0] < 0.0
    assert not test.routing_pays


def test_no_loss_on_either_type_predicts_no_saving() -> None:
    assert two_type_saving(0.5, 0.0, 0.0, 1.0) == 0.0


def test_a_top_tier_exactly_as_accurate_as_the_cheapest_predicts_no_saving() -> None:
    n = 1000
    top, cheap = np.ones(n), np.ones(n)
    top[:50] = 0.0  # the easy half: the cheap tier wins 50 rows
    cheap[500:550] = 0.0  # the hard half: the top tier wins 50 rows
    proba = np.c_[np.r_[np.full(500, 0.9), np.full(500, 0.5)], np.ones(n)]
    correct = np.c_[cheap, top]
    assert correct[:, 0].mean() == correct[:, 1].mean()
    test = pretest(proba, correct, COSTS)
    assert test.predicted_saving == 0.0 and not test.routing_pays


def test_the_pretest_message_says_when_nothing_was_measured() -> None:
    """A top tier less accurate than the cheapest leaves no point of the savings curve at a
    static split's quality: the message says so instead of printing `nan` (it reached
    `/admin/tenants` as "largest measured nan (95% CI nan to nan)")."""
    proba = np.c_[np.linspace(0.1, 0.9, 10), np.linspace(0.9, 0.1, 10)]
    correct = np.c_[np.ones(10), np.r_[np.zeros(5), np.ones(5)]]
    test = pretest(proba, correct, COSTS)
    assert not np.isfinite(test.measured_saving)
    assert "nan" not in test.message
    assert "largest measured: none" in test.message
    assert not test.routing_pays


def _two_rows_better_than_the_best_tier(n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """No tier meets an absolute floor of 0.9 (0.85 and 0.88); a router that sends the cheap
    tier only its 85 correct rows scores exactly 0.90, two rows above the top tier: a paired
    difference of +0.02 whose one-sided 95 % bound is 0.02 - 1.645 * 0.1407 / 10 = -0.0031."""
    cheap, top = np.zeros(n), np.zeros(n)
    cheap[:85] = 1.0
    top[2:90] = 1.0
    proba = np.column_stack([np.where(np.arange(n) < 85, 0.95, 0.1), np.ones(n)])
    return proba, np.column_stack([cheap, top])


def test_a_routed_policy_above_the_floor_by_noise_does_not_beat_a_tier_below_it() -> None:
    """Against a uniform tier below the floor, the paired bound must be at least zero: the
    point estimate meets the floor, but two rows of 100 are not evidence, so no routing."""
    proba, correct = _two_rows_better_than_the_best_tier()
    naive = tune(proba, correct, COSTS, alpha=0.9, relative=False, confidence=None)
    assert naive.routing_pays and naive.expected_quality == pytest.approx(0.9)
    careful = tune(proba, correct, COSTS, alpha=0.9, relative=False)
    assert not careful.routing_pays and careful.thresholds == (1.0,)
    # The bound is the paired mean minus z times the sample sd (ddof=1) over sqrt(n).
    d = correct[:, 0] * (proba[:, 0] > 0.5) + correct[:, 1] * (proba[:, 0] <= 0.5) - correct[:, 1]
    bound = d.mean() - 1.6448536269514722 * d.std(ddof=1) / np.sqrt(d.size)
    assert f"quality difference {bound:+.4f}, allowed +0.0000" in careful.message


def test_a_floor_met_only_by_noise_within_the_budget_is_judged_against_the_floor() -> None:
    """The same noise within a budget: the floor is reachable (judged at the floor, not
    called out of reach), the routed point is refused, and the budget's best tier stays."""
    _, correct = _two_rows_better_than_the_best_tier()
    swapped = correct[:, ::-1].copy()  # now the cheap tier scores 0.88, the top 0.85
    routed = np.column_stack([np.where(np.arange(100) < 2, 0.1, 0.95), np.ones(100)])
    result = tune(routed, swapped, COSTS, alpha=0.9, budget=0.5, relative=False)
    assert not result.routing_pays and result.baseline.tier == 0
    assert "below the floor" in result.message and "out of reach" not in result.message


def test_the_two_type_split_never_separates_tied_risks() -> None:
    """Requests with the same risk are indistinguishable to the router: one group."""
    assert split_two_types([0.3] * 10).all()
    easy = split_two_types([0.1, 0.1, 0.1, 0.9, 0.9])
    assert easy.tolist() == [True, True, True, False, False]


def test_the_pretest_interval_is_the_central_95_percent_of_the_finite_draws() -> None:
    """The pre-test reports 95% intervals: the 2.5% and 97.5% quantiles of the bootstrap
    draws that are finite (a resample whose top tier is no better than the cheapest draws
    NaN)."""
    from router_models.pretest import _interval

    draws = np.r_[np.arange(1001.0), np.nan, np.inf, -np.inf]
    assert _interval(draws) == (25.0, 975.0)
    low, high = _interval(np.full(3, np.nan))
    assert np.isnan(low) and np.isnan(high)


def test_a_floor_that_only_a_middle_uniform_tier_meets_within_the_budget_is_met() -> None:
    """Three tiers; the middle one meets the floor within the budget, and no routed policy
    does (the routed frontier runs from the cheapest tier to the top, past the middle
    one): tune returns that tier and says the floor is met. It said "the floor is out of
    reach within the budget" and feasible false while returning the tier that meets it."""
    correct = np.array([[0, 1, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1], [0, 0, 1], [0, 1, 0]])
    proba = np.array(
        [[0.1, 0.3, 1], [0.4, 0.5, 1], [0.3, 0.4, 1], [0.3, 0.5, 1], [0.3, 0.9, 1], [0.3, 0.6, 1]]
    )
    result = tune(proba, correct, (0.25, 0.5, 1.0), alpha=1.0, budget=0.6, confidence=None)
    assert not result.routing_pays and result.thresholds == (1.0, 0.0)  # all on tier 1
    assert result.expected_cost == 0.5 and result.expected_quality >= result.floor
    assert result.feasible and "out of reach" not in result.message


def test_equally_cheap_uniform_tiers_meeting_the_floor_give_the_better_baseline() -> None:
    """nvfp4 and w4a16 cost the same (the default ladder): the baseline, which is what an
    alpha tenant is served from when routing does not pay, is the better of the two."""
    correct = np.array([[0, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=float)
    costs = (0.25, 0.25, 1.0)
    baseline, ok = uniform_baseline(correct, costs, 0.7)
    assert ok and baseline.tier == 1 and baseline.quality == 1.0
    proba = np.column_stack([np.full(4, 0.5), np.full(4, 0.6), np.ones(4)])
    result = tune(proba, correct, costs, alpha=0.7)
    assert not result.routing_pays and result.baseline.tier == 1
    assert apply(proba, correct, costs, result.thresholds) == (0.25, 1.0)


def test_routed_frontier_never_takes_a_tier_the_next_one_matches_in_cost() -> None:
    """nvfp4 and w4a16 cost the same: the next tier's probability is at least the cheaper
    one's, so the routed frontier sends nothing to nvfp4 and stays on or above the static
    split (it started at all-nvfp4, below the uniform w4a16 point at the same cost)."""
    rng = np.random.default_rng(11)
    n = 2000
    difficulty = rng.random(n)
    levels = np.array([0.4, 0.7, 1.01])
    correct = (difficulty[:, None] < levels).astype(float)
    proba = np.column_stack([1 - difficulty, np.minimum(1.0, 1.4 - difficulty), np.ones(n)])
    proba = np.maximum.accumulate(np.clip(proba, 0.0, 0.99), axis=1)
    proba[:, -1] = 1.0
    costs = (0.25, 0.25, 1.0)
    routed, static = routed_frontier(proba, correct, costs), static_frontier(correct, costs)
    assert np.all(routed.quality >= np.interp(routed.cost, static.cost, static.quality) - 1e-12)
    for lam in routed.lam:
        thresholds = thresholds_for(lam, costs)
        assert thresholds[0] == 1.0
    for i in range(len(routed.lam)):
        cost, quality = apply(proba, correct, costs, thresholds_for(routed.lam[i], costs))
        assert (cost, quality) == (pytest.approx(routed.cost[i]), pytest.approx(routed.quality[i]))


def test_the_predicted_interval_brackets_the_kink_saving_not_the_curve_at_its_quality() -> None:
    """Paper A's dC* is what the kink policy (every hard request up) saves. Here the least
    risky half of the hard group gains nothing from the top tier, so the router's curve reaches
    the kink's quality at half the hard share: read there, the "predicted" interval was
    (0.31, 0.39) around a predicted saving of 0.2, which it did not contain."""
    reps = 50
    risk = np.r_[np.full(6 * reps, 0.1), np.linspace(0.5, 0.8, 4 * reps)]
    n = risk.size
    top, cheap = np.ones(n), np.ones(n)
    cheap[:reps] = 0.0  # one easy request in six loses: eps = 1/6
    cheap[risk >= 0.65] = 0.0  # the riskier half of the hard group loses: delta = 1/2
    test = pretest(np.c_[1.0 - risk, np.ones(n)], np.c_[cheap, top], COSTS)
    expected = two_type_saving(0.6, 1.0 / 6.0, 0.5, COSTS[1] - COSTS[0])
    assert test.p == pytest.approx(0.6)
    assert test.eps == pytest.approx(1.0 / 6.0) and test.delta == pytest.approx(0.5)
    assert test.predicted_saving == pytest.approx(expected) == pytest.approx(0.2)
    low, high = test.predicted_ci
    assert low < test.predicted_saving < high
    assert test.measured_saving == pytest.approx(0.35)  # the curve's best point saves more


def test_the_pretest_pairs_the_cheapest_tier_routing_may_use_with_the_top() -> None:
    """With nvfp4 and w4a16 at the same cost routing never takes nvfp4: the pre-test judged a
    policy the gateway cannot run. It now reads the w4a16 column, whatever nvfp4's holds."""
    proba, correct, _ = two_types(4000, 0.7, 0.05, 0.5, q_top=0.9)
    rng = np.random.default_rng(5)
    noise = rng.random((len(proba), 1))
    equal = (0.25, 0.25, 1.0)
    three_p = np.column_stack([noise, proba[:, 0], proba[:, 1]])
    three_c = np.column_stack([(noise > 0.5).astype(float), correct[:, 0], correct[:, 1]])
    assert pretest(three_p, three_c, equal) == pretest(proba, correct, (0.25, 1.0))
