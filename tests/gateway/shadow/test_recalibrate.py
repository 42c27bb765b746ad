"""Online recalibration: per-tier labels, the prior-weighted refit, and when to refit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from gateway.config import RouterSettings, default_settings
from gateway.metrics import GatewayMetrics
from gateway.routing.factory import build_policy
from gateway.routing.router import RouterPolicy
from gateway.shadow.recalibrate import (
    Recalibrator,
    ScoredLabel,
    label_matrix,
    needs_refit,
    refit,
)
from gateway.stats import CompletedExchange
from router_models.training import TrainConfig, fit_router
from tests.router_models.synthetic import two_type_labels


def test_each_label_marks_only_its_own_tier() -> None:
    labels = [ScoredLabel(0.1, 0, True), ScoredLabel(0.9, 1, False), ScoredLabel(0.5, 2, True)]
    matrix = label_matrix(labels, 4)  # 3 calibrated tiers below the top
    assert np.array_equal(np.nan_to_num(matrix, nan=-1), [[1, -1, -1], [-1, 0, -1], [-1, -1, 1]])


def flat_prior(value: float):  # type: ignore[no-untyped-def]
    return lambda scores: np.column_stack([np.full(len(scores), value)] * 3)


def test_many_labels_override_the_prior_few_labels_do_not() -> None:
    rng = np.random.default_rng(0)
    # Truth: the cheapest tier is adequate only below score 0.5.
    scores = rng.uniform(0, 1, 400)
    labels = [ScoredLabel(float(s), 0, bool(s < 0.5)) for s in scores]
    calibration = refit(labels, flat_prior(0.9), 3, prior_weight=20, min_labels=50)
    p = calibration.predict_proba(np.array([0.2, 0.8]))[:, 0]
    assert p[0] > 0.85 and p[1] < 0.25  # the labels decide

    few = labels[:6]
    calibration = refit(few, flat_prior(0.9), 3, prior_weight=50, min_labels=50)
    p = calibration.predict_proba(np.array([0.2, 0.8]))[:, 0]
    assert p[1] > 0.7  # six labels barely move a strong prior


def test_refit_probabilities_are_monotone_along_the_ladder() -> None:
    labels = [ScoredLabel(float(s), int(s * 3) % 2, bool(s < 0.6)) for s in np.linspace(0, 1, 200)]
    calibration = refit(labels, flat_prior(0.5), 3, prior_weight=10, min_labels=50)
    proba = calibration.predict_proba(np.linspace(-1, 2, 50))
    assert np.all(np.diff(proba, axis=1) >= -1e-12)
    assert np.all((proba >= 0) & (proba <= 1))


def scored_exchange(score: float) -> CompletedExchange:
    return CompletedExchange(
        tenant="default",
        kind="chat",
        tier="nvfp4",
        tier_index=0,
        request={},
        body=b"",
        probability=None,
        probabilities=None,
        reason="test",
        score=score,
    )


def test_refits_keep_coming_once_the_label_window_is_full() -> None:
    policy = build_policy(default_settings())
    assert isinstance(policy, RouterPolicy)
    metrics = GatewayMetrics(CollectorRegistry())
    recalibrator = Recalibrator(policy, metrics, window=10, min_labels=10, prior_weight=0)
    scores = np.linspace(0.0, 1.0, 10)
    for score in scores:
        recalibrator.label("default", 0, scored_exchange(float(score)), adequate=True)
    assert recalibrator.recalibrate_all() == ["default"]
    assert recalibrator.recalibrate_all() == []  # nothing new: no refit
    for score in scores:  # the window is full: these replace the first ten
        recalibrator.label("default", 0, scored_exchange(float(score)), adequate=False)
    assert recalibrator.recalibrate_all() == ["default"]
    assert recalibrator.refits == 2


def test_the_window_holds_labels_per_tier() -> None:
    """A window per tenant let a busy tier push a rarely labelled one (an explored tier) out:
    5 labels for tier 1, then 10 for tier 0, left none of tier 1's in a window of 10."""
    policy = build_policy(default_settings())
    assert isinstance(policy, RouterPolicy)
    metrics = GatewayMetrics(CollectorRegistry())
    recalibrator = Recalibrator(policy, metrics, window=10, min_labels=5, prior_weight=0)
    for score in np.linspace(0.0, 1.0, 5):
        recalibrator.label("default", 1, scored_exchange(float(score)), adequate=False)
    for score in np.linspace(0.0, 1.0, 10):
        recalibrator.label("default", 0, scored_exchange(float(score)), adequate=True)
    assert recalibrator.recalibrate_all() == ["default"]
    assert recalibrator.models["default"].metadata["shadow_labels"] == 15


def test_needs_refit_counts_arrivals_not_the_window() -> None:
    assert not needs_refit(held=5, arrived=5, arrived_at_refit=None, min_labels=50)
    assert needs_refit(held=10, arrived=10, arrived_at_refit=None, min_labels=50)
    assert not needs_refit(held=10, arrived=10, arrived_at_refit=10, min_labels=10)
    assert needs_refit(held=10, arrived=20, arrived_at_refit=10, min_labels=10)


def refitted_once(policy: RouterPolicy) -> Recalibrator:
    """A recalibrator (window 20, 10 labels to refit) that has refitted tenant `default`
    once, on 20 adequate labels spread over the scores."""
    metrics = GatewayMetrics(CollectorRegistry())
    recalibrator = Recalibrator(policy, metrics, window=20, min_labels=10, prior_weight=0)
    for score in np.linspace(0.0, 1.0, 20):
        recalibrator.label("default", 0, scored_exchange(float(score)), adequate=True)
    assert recalibrator.recalibrate_all() == ["default"]
    return recalibrator


def test_a_reload_applies_new_window_and_fit_settings() -> None:
    policy = build_policy(default_settings())
    assert isinstance(policy, RouterPolicy)
    recalibrator = refitted_once(policy)
    recalibrator.attach(policy, window=12, min_labels=10, prior_weight=0)
    assert recalibrator.window == 12
    assert recalibrator.recalibrate_all() == ["default"]  # refitted on the newest 12
    assert recalibrator.models["default"].metadata["shadow_labels"] == 12
    recalibrator.attach(policy, window=12, min_labels=10, prior_weight=5.0)
    assert recalibrator.prior_weight == 5.0
    assert recalibrator.recalibrate_all() == ["default"]  # same labels, new prior weight
    recalibrator.attach(policy, window=12, min_labels=10, prior_weight=5.0)
    assert recalibrator.recalibrate_all() == []  # nothing changed


def test_a_reload_that_swaps_the_router_model_drops_the_refitted_ones(tmp_path: Path) -> None:
    labels, _ = two_type_labels(
        300, p_easy=0.6, eps=0.03, delta=0.4, tiers=("nvfp4", "w4a16", "bf16"), seed=3
    )
    fit_router(labels, TrainConfig(scorer="linear")).save(tmp_path / "other")
    settings = default_settings()
    policy = build_policy(settings)
    assert isinstance(policy, RouterPolicy)
    recalibrator = refitted_once(policy)

    reloaded = build_policy(settings)  # the same model read again: the refit still fits it
    assert isinstance(reloaded, RouterPolicy)
    recalibrator.attach(reloaded)
    assert "default" in reloaded.tenant_models

    other = RouterSettings(model_dir=tmp_path / "other")
    swapped = build_policy(settings.model_copy(update={"router": other}))
    assert isinstance(swapped, RouterPolicy)
    recalibrator.attach(swapped)
    # The refit scored with the old scorer: the new model serves, the old labels are gone.
    assert "default" not in swapped.tenant_models
    assert recalibrator.recalibrate_all() == []


def test_a_reload_that_removes_a_tenant_drops_its_labels() -> None:
    """Labels held for a tenant the reload removed still refitted a model on the timer: put
    in the policy for no tenant, and counted in tiergate_shadow_recalibrations_total for it."""
    from pydantic import SecretStr

    from gateway.config import TenantSettings

    settings = default_settings()
    extra = TenantSettings(name="u", api_keys=[SecretStr("sk-u")])
    policy = build_policy(settings.model_copy(update={"tenants": [*settings.tenants, extra]}))
    assert isinstance(policy, RouterPolicy)
    recalibrator = Recalibrator(
        policy, GatewayMetrics(CollectorRegistry()), window=20, min_labels=10, prior_weight=0
    )
    for score in np.linspace(0.0, 1.0, 20):
        recalibrator.label("u", 0, scored_exchange(float(score)), adequate=True)
    reloaded = build_policy(settings)  # u is gone before the timer's refit
    assert isinstance(reloaded, RouterPolicy)
    recalibrator.attach(reloaded)
    assert recalibrator.recalibrate_all() == []
    assert "u" not in reloaded.tenant_models


def test_a_label_scored_by_a_swapped_out_model_is_dropped(tmp_path: Path) -> None:
    """An exchange captured before a reload swapped the router model arrives after it: its
    score is the old scorer's, and refitting the new model's calibration on it is wrong."""
    labels, _ = two_type_labels(
        300, p_easy=0.6, eps=0.03, delta=0.4, tiers=("nvfp4", "w4a16", "bf16"), seed=3
    )
    fit_router(labels, TrainConfig(scorer="linear")).save(tmp_path / "other")
    settings = default_settings()
    policy = build_policy(settings)
    assert isinstance(policy, RouterPolicy) and policy.model_id is not None
    recalibrator = Recalibrator(
        policy, GatewayMetrics(CollectorRegistry()), window=20, min_labels=10, prior_weight=0
    )
    other = RouterSettings(model_dir=tmp_path / "other")
    swapped = build_policy(settings.model_copy(update={"router": other}))
    assert isinstance(swapped, RouterPolicy) and swapped.model_id != policy.model_id
    recalibrator.attach(swapped)
    old_scores = [
        dataclasses.replace(scored_exchange(float(s)), router_model=policy.model_id)
        for s in np.linspace(0.0, 1.0, 20)
    ]
    for exchange in old_scores:
        recalibrator.label("default", 0, exchange, adequate=True)
    assert recalibrator.recalibrate_all() == []
    for exchange in old_scores:  # the same labels, scored by the model now serving
        current = dataclasses.replace(exchange, router_model=swapped.model_id)
        recalibrator.label("default", 0, current, adequate=True)
    assert recalibrator.recalibrate_all() == ["default"]
