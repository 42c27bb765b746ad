"""Evaluation metrics: APGR/CPT (RouteLLM definitions), ECE, Brier, the evaluate document."""

from __future__ import annotations

import numpy as np
import pytest

from router_models.evaluation import apgr_cpt, evaluate, expected_calibration_error, static_apgr
from router_models.labels import routing_proba, routing_proba_one


def pair(n: int = 20_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weak = (rng.random(n) < 0.65).astype(float)
    strong = np.maximum(weak, (rng.random(n) < 0.5).astype(float))
    return np.column_stack([weak, strong])


def as_proba(risk: np.ndarray) -> np.ndarray:
    return np.column_stack([1.0 - risk, np.ones_like(risk)])


def test_random_router_scores_one_half_and_oracle_more() -> None:
    correct = pair()
    rng = np.random.default_rng(1)
    apgr, (cpt50, _) = apgr_cpt(as_proba(rng.random(len(correct))), correct, (0.5, 1.0))
    assert apgr == pytest.approx(0.5, abs=0.02)
    assert cpt50 == pytest.approx(0.5, abs=0.03)
    gain = correct[:, 1] - correct[:, 0]
    oracle, (oracle50, _) = apgr_cpt(as_proba(gain * 0.9), correct, (0.5, 1.0))
    assert oracle > 0.9 and oracle50 < 0.2
    assert static_apgr(correct, (0.5, 1.0)) == pytest.approx(0.5)


def test_apgr_equals_the_routellm_computation_for_two_tiers() -> None:
    correct = pair(2000, 3)
    rng = np.random.default_rng(4)
    score = rng.random(2000) + 0.3 * (correct[:, 1] - correct[:, 0])
    apgr, _ = apgr_cpt(as_proba(score / score.max()), correct, (0.25, 1.0))
    # RouteLLM: send the top-scored share to the strong model, PGR against that share.
    order = np.argsort(-score)
    gain = (correct[:, 1] - correct[:, 0])[order]
    acc = (correct[:, 0].sum() + np.r_[0, np.cumsum(gain)]) / 2000
    pgr = (acc - correct[:, 0].mean()) / (correct[:, 1].mean() - correct[:, 0].mean())
    assert apgr == pytest.approx(np.trapezoid(pgr, np.arange(2001) / 2000), abs=1e-9)


def test_ece() -> None:
    assert expected_calibration_error([0.8] * 10, [1] * 8 + [0] * 2) == pytest.approx(0.0)
    assert expected_calibration_error([0.9] * 10, [1] * 5 + [0] * 5) == pytest.approx(0.4)


def test_evaluate_document_has_the_promised_keys() -> None:
    correct = np.column_stack([pair(3000)[:, :1], pair(3000)[:, 1:], pair(3000)[:, 1:]])
    rng = np.random.default_rng(0)
    proba = np.sort(rng.random((3000, 3)), axis=1)
    proba[:, -1] = 1.0
    doc = evaluate(proba, correct, ("nvfp4", "w4a16", "bf16"), (0.25, 0.25 + 1e-3, 1.0))
    for key in (
        "n",
        "tiers",
        "per_tier",
        "apgr",
        "cpt50",
        "cpt80",
        "frontier",
        "static_frontier",
        "uniform_baseline",
        "pretest",
    ):
        assert key in doc
    assert set(doc["per_tier"]) == {"nvfp4", "w4a16"}
    assert set(doc["per_tier"]["nvfp4"]) >= {"auc", "ece", "brier"}
    assert set(doc["pretest"]) >= {"p", "eps", "delta", "predicted_saving", "measured_saving"}
    assert set(doc["uniform_baseline"]) == {"tier", "quality", "cost"}
    assert all(set(p) == {"cost", "quality"} for p in doc["frontier"])
    assert len(doc["frontier"]) <= 101


def test_absolute_probabilities_route_on_the_expected_loss_against_the_top_tier() -> None:
    """Under the absolute label a request every tier gets wrong has low probabilities on
    every tier; routing on them kept it on the top tier, where it is wrong too, and scored
    below random. Routing reads one minus the expected loss against the top tier."""
    rng = np.random.default_rng(7)
    kinds = rng.integers(0, 3, 3000)  # 0: both right, 1: only the top right, 2: both wrong
    correct = np.array([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])[kinds]
    # Calibrated P(tier correct) per kind, as an absolute-label model would give them.
    proba = np.array([[0.9, 0.95], [0.2, 0.9], [0.05, 0.1]])[kinds]
    doc = evaluate(proba, correct, ["cheap", "top"], [0.25, 1.0], label="absolute")
    assert doc["apgr"] > 0.8  # it scored 0.5 at best while the both-wrong kind went up first
    routed = routing_proba(proba, "absolute")
    assert routed[:, -1].tolist() == [1.0] * len(kinds)
    assert np.all(routed[:, 0] < 1.0)  # a threshold of 1.0 still never accepts the cheap tier
    assert routed[kinds == 2, 0].min() > routed[kinds == 1, 0].max()
    for row, expected in zip(proba[:20], routed[:20], strict=True):
        assert routing_proba_one(tuple(row), "absolute") == tuple(expected)
    # Calibration is still judged on the absolute probabilities: about 0.117 here (0.1, 0.2
    # and 0.05 off by kind), where the routing ones would be 0.95 off for the both-wrong kind.
    assert doc["per_tier"]["cheap"]["ece"] == pytest.approx(0.117, abs=0.01)
    assert np.array_equal(routing_proba(proba, "relative"), proba)
    assert routing_proba_one((0.3, 1.0), "relative") == (0.3, 1.0)


def test_ece_counts_a_probability_of_exactly_one() -> None:
    """p = 1.0 falls in the last bin, not outside every bin (a model sure and wrong)."""
    assert expected_calibration_error([1.0, 1.0], [0.0, 0.0]) == pytest.approx(1.0)


def test_cpt_interpolates_and_takes_the_first_point_on_a_plateau() -> None:
    """Four rows, the top tier fixes the first and third the router sends it: PGR is 0, 0.5,
    0.5, 1, 1 at top-call shares 0, 0.25, 0.5, 0.75, 1. CPT(0.5) is the start of the plateau,
    CPT(0.8) interpolates between 0.5 and 0.75, CPT(0) is the first point."""
    correct = np.array([[0, 1], [1, 1], [0, 1], [1, 1]], dtype=float)
    proba = np.array([[0.1, 1.0], [0.2, 1.0], [0.3, 1.0], [0.4, 1.0]])
    apgr, cpts = apgr_cpt(proba, correct, (0.25, 1.0), levels=(0.0, 0.5, 0.8))
    assert apgr == pytest.approx(0.625)
    assert cpts == [0.0, 0.25, pytest.approx(0.65)]


def test_apgr_is_undefined_when_the_top_tier_is_no_better() -> None:
    correct = np.array([[0, 1], [1, 0]], dtype=float)
    proba = np.array([[0.2, 1.0], [0.7, 1.0]])
    assert apgr_cpt(proba, correct, (0.25, 1.0)) == (None, [None, None])
