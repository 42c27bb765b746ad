"""Online recalibration: refit a tenant's K-1 isotonic calibrators on its shadow labels.

Every label says whether one cheaper tier was adequate for one request, with the router's
raw score for that request. Each tier is fitted on its own direct labels only. Filling other
tiers by ladder monotonicity (adequate at k implies adequate above) would be true per
request but would bias the sample: which requests get a filled label depends on the other
tier's verdict. Routing depends on the score alone and shadow sampling is random, so direct
labels are an unbiased sample at every score; the calibration itself makes the result
monotone along the ladder. The shipped model acts
as a prior: a tier with n < `min_labels` direct labels also gets
`prior_weight * (1 - n / min_labels)` pseudo-rows at the observed scores, carrying the
shipped model's probabilities as fractional targets; from `min_labels` labels on, the tier
is fitted on its labels alone (a prior kept forever would bias the scores where labels are
sparse). The new model replaces the tenant's in one reference assignment.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gateway.metrics import GatewayMetrics
from gateway.routing.router import RouterPolicy
from gateway.stats import CompletedExchange
from router_models.isotonic_maps import IsotonicMaps
from router_models.model import RouterModel

log = logging.getLogger("tiergate.recalibrate")


@dataclass(frozen=True, slots=True)
class ScoredLabel:
    score: float
    tier: int  # gateway ladder index of the tier that answered
    adequate: bool


def label_matrix(labels: list[ScoredLabel], n_tiers: int) -> np.ndarray:
    """(n, K-1) adequacy: each row labels only the tier that was judged, NaN elsewhere."""
    matrix = np.full((len(labels), n_tiers - 1), np.nan)
    for row, label in enumerate(labels):
        matrix[row, label.tier] = 1.0 if label.adequate else 0.0
    return matrix


def refit(
    labels: list[ScoredLabel],
    prior: Callable[[np.ndarray], np.ndarray],
    n_tiers: int,
    prior_weight: float,
    min_labels: int,
) -> IsotonicMaps:
    """A calibration fitted on the labels plus fading prior pseudo-rows (module docstring)."""
    # scikit-learn is imported on the first refit, not when the gateway starts.
    from router_models.calibration import TierCalibration

    scores = np.array([label.score for label in labels], dtype=np.float64)
    observed = label_matrix(labels, n_tiers)
    counts = np.sum(~np.isnan(observed), axis=0)
    rows_score, rows_target = [scores], [observed]
    for tier in range(n_tiers - 1):
        weight = prior_weight * max(0.0, 1.0 - counts[tier] / max(1, min_labels))
        rows = max(2, round(weight)) if counts[tier] < 2 or weight > 0 else 0
        if rows == 0:
            continue
        anchor = np.quantile(scores, np.linspace(0.0, 1.0, rows)) if scores.size else np.zeros(rows)
        target = np.full((rows, n_tiers - 1), np.nan)
        target[:, tier] = prior(anchor)[:, tier]
        rows_score.append(anchor)
        rows_target.append(target)
    return TierCalibration().fit(np.concatenate(rows_score), np.vstack(rows_target))


def needs_refit(held: int, arrived: int, arrived_at_refit: int | None, min_labels: int) -> bool:
    """Whether a tenant holding `held` labels, `arrived` received in all, is due a refit:
    enough labels to fit, and some arrived since the last refit."""
    return held >= min(10, min_labels) and arrived != arrived_at_refit


class Recalibrator:
    """LabelSink for the shadow sampler; refits per tenant on a timer."""

    def __init__(
        self,
        policy: RouterPolicy,
        metrics: GatewayMetrics,
        *,
        window: int,
        min_labels: int,
        prior_weight: float,
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self.window = window
        self.min_labels = min_labels
        self.prior_weight = prior_weight
        # The newest `window` labels per tenant and tier: a window per tenant let a busy tier
        # push a rarely labelled one (an explored tier) out, which then never reached
        # min_labels however many labels it had received.
        self._labels: dict[str, dict[int, deque[ScoredLabel]]] = {}
        # Labels received per tenant, ever, and that count at its last refit: the window's
        # length stops growing once it is full, so it cannot say whether labels arrived.
        self._arrived: dict[str, int] = {}
        self._fitted_at: dict[str, int] = {}
        self.models: dict[str, RouterModel] = {}  # the current recalibrated model per tenant
        self.refits = 0

    def attach(
        self,
        policy: RouterPolicy,
        *,
        window: int | None = None,
        min_labels: int | None = None,
        prior_weight: float | None = None,
    ) -> None:
        """Follows a configuration reload: the new policy gets the tenants' refitted models,
        later refits go to it, and new settings apply (the labels kept are the newest that
        fit the window; changed fit settings refit). When the ladder's tier names or the
        router model changed, the refitted models and every kept label are dropped."""
        self._configure(window, min_labels, prior_weight)
        # A refitted model keeps the scorer it was fitted on, and the labels hold that
        # scorer's scores: after a swap of the router model neither means anything.
        same_router = (policy.tier_names, policy.model_id) == (
            self.policy.tier_names,
            self.policy.model_id,
        )
        if same_router:
            self._forget_tenants_not_in(policy)
            for tenant, model in self.models.items():
                policy.set_tenant_model(tenant, model)
        else:
            self.models.clear()
            self._labels.clear()
            self._arrived.clear()
            self._fitted_at.clear()
        self.policy = policy

    def _forget_tenants_not_in(self, policy: RouterPolicy) -> None:
        """Drops what is kept for tenants the reload removed: their held labels would still
        refit a model on the timer, for no tenant, and bring their recalibration series back."""
        for kept in (self.models, self._labels, self._arrived, self._fitted_at):
            for tenant in [name for name in kept if name not in policy.routing]:
                del kept[tenant]

    def _configure(
        self, window: int | None, min_labels: int | None, prior_weight: float | None
    ) -> None:
        if window is not None and window != self.window:
            self.window = window
            for tiers in self._labels.values():
                for tier, labels in tiers.items():
                    tiers[tier] = deque(labels, maxlen=window)
            self._fitted_at.clear()
        refit_with = (
            min_labels if min_labels is not None else self.min_labels,
            prior_weight if prior_weight is not None else self.prior_weight,
        )
        if refit_with != (self.min_labels, self.prior_weight):
            self.min_labels, self.prior_weight = refit_with
            self._fitted_at.clear()  # the same labels fit differently now

    def label(self, tenant: str, tier: int, exchange: CompletedExchange, adequate: bool) -> None:
        if exchange.score is None:
            return  # pinned requests carry no router score; they still count as labels elsewhere
        if exchange.router_model not in (None, self.policy.model_id):
            return  # scored by a model a reload has swapped out since (attach dropped its kin)
        tiers = self._labels.setdefault(tenant, {})
        labels = tiers.get(tier)
        if labels is None:
            labels = tiers[tier] = deque(maxlen=self.window)
        labels.append(ScoredLabel(exchange.score, tier, adequate))
        self._arrived[tenant] = self._arrived.get(tenant, 0) + 1

    def recalibrate_all(self) -> list[str]:
        """Refits every tenant with enough new labels; returns the tenants refitted."""
        done = []
        for tenant, tiers in list(self._labels.items()):
            labels = [label for kept in tiers.values() for label in kept]
            arrived = self._arrived.get(tenant, 0)
            if not needs_refit(len(labels), arrived, self._fitted_at.get(tenant), self.min_labels):
                continue
            try:
                self._refit(tenant, labels)
            except ValueError as exc:  # e.g. degenerate labels: keep the current model
                log.warning("recalibration of %s skipped: %s", tenant, exc)
                continue
            self._fitted_at[tenant] = arrived
            done.append(tenant)
        return done

    def _refit(self, tenant: str, labels: list[ScoredLabel]) -> None:
        policy = self.policy
        base = policy.model
        n_tiers = len(policy.tier_names)
        positions = list(policy.positions)

        def prior(scores: np.ndarray) -> np.ndarray:
            return base.routing_proba(scores)[:, positions]

        calibration = refit(labels, prior, n_tiers, self.prior_weight, self.min_labels)
        model = base.with_calibration(calibration, tiers=policy.tier_names).with_metadata(
            recalibrated_for=tenant, shadow_labels=len(labels)
        )
        policy.set_tenant_model(tenant, model)
        self.models[tenant] = model
        self.refits += 1
        self.metrics.recalibrations.labels(tenant).inc()
        log.warning(
            "recalibrated the router for tenant %s on %d shadow labels", tenant, len(labels)
        )


__all__ = ["Recalibrator", "ScoredLabel", "label_matrix", "needs_refit", "refit"]
