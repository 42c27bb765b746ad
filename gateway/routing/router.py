"""The calibrated difficulty router as the gateway's routing policy.

Per request: the model's raw difficulty score, its K calibrated probabilities that each
tier is adequate (mapped onto the gateway's ladder), then the pure decision of
`router_models.policy`: the cheapest allowed tier whose probability clears the tenant's
threshold for it, else the tenant's top tier.

A tenant sets thresholds explicitly, or an accuracy floor alpha from which `tune` derives
them on the model's validation set (when the model directory carries one). When routing
does not beat the cheapest uniform tier meeting the floor, the thresholds send everything
to that tier: never worse than the honest baseline. Online recalibration (shadow labels)
swaps a tenant's model for one with refitted calibrators, as one reference assignment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from gateway.config import Settings, TenantSettings
from gateway.protocol import EndpointKind
from gateway.routing.policy import Decision
from gateway.tenants.registry import Tenant, allowed_tier_indices
from router_models.frontier import saves_on_next
from router_models.model import RouterModel
from router_models.pretest import PreTest

log = logging.getLogger("tiergate.router")


def ladder_positions(model_tiers: tuple[str, ...], gateway_tiers: list[str]) -> tuple[int, ...]:
    """Which model tier stands for each gateway tier: by name when the ladders share their
    names in the same order (a model trained on this gateway's shadow labels), else by
    relative position, so the cheapest maps to the cheapest and the top to the top.

    Only the gateway's top tier may stand on the model's top: under the relative label that
    tier's probability is 1, so a cheaper gateway tier mapped there would clear every
    threshold and the top tier would never serve.

    Raises ValueError when the ladders share their names in another order: one of them is
    not cheapest first, and mapping by position would give each tier another's probability."""
    if set(gateway_tiers) <= set(model_tiers):
        by_name = tuple(model_tiers.index(name) for name in gateway_tiers)
        if all(lower < upper for lower, upper in pairwise(by_name)):
            return by_name
        raise ValueError(
            f"the router model's tiers {list(model_tiers)} and the gateway's {gateway_tiers} "
            "name the same tiers in another order; both are cheapest first, so one is wrong: "
            "reorder the gateway's tiers or give router.model_dir a model for this ladder"
        )
    top, k_gateway = len(model_tiers) - 1, len(gateway_tiers)
    below_top = (min(round(i * top / (k_gateway - 1)), top - 1) for i in range(k_gateway - 1))
    return (*below_top, top)


# Pre-tests by (model checksum, validation columns, costs): they do not depend on alpha, and
# the bootstrap takes about a second on 14,000 rows; a reload runs on the event loop.
_PRETESTS: dict[tuple[object, ...], PreTest] = {}
_MAX_PRETESTS = 64


def _kept_pretest(key: tuple[object, ...], compute: Callable[[], PreTest]) -> PreTest:
    """The pre-test kept under `key`, computed once; the oldest goes past _MAX_PRETESTS."""
    check = _PRETESTS.get(key)
    if check is None:
        if len(_PRETESTS) >= _MAX_PRETESTS:
            del _PRETESTS[next(iter(_PRETESTS))]
        check = _PRETESTS[key] = compute()
    return check


@dataclass(frozen=True, slots=True)
class Validation:
    """Held-out rows on the model's ladder: routing probabilities (`labels.routing_proba`) and
    per-tier correctness."""

    proba: Any  # (n, K_model)
    correct: Any  # (n, K_model)


@dataclass(frozen=True, slots=True)
class TenantRouting:
    """A tenant's resolved thresholds (one per gateway tier but the top) and their origin."""

    thresholds: tuple[float, ...]
    source: str  # "explicit", "alpha", "default"
    routing_pays: bool | None = None  # tune's verdict against that tier, when alpha was tuned
    uniform_floor_tier: int | None = None  # cheapest uniform tier meeting the floor
    note: str = ""
    # Paper A's two-type pre-test on the same validation columns (cheapest vs top allowed
    # tier): whether the traffic is heterogeneous enough for routing to pay at all.
    pretest_pays: bool | None = None
    pretest: str = ""


class RouterPolicy:
    """RoutingPolicy backed by a RouterModel (one per tenant once recalibrated)."""

    def __init__(
        self,
        model: RouterModel,
        settings: Settings,
        validation: Validation | None = None,
        *,
        model_id: str | None = None,  # the weights' checksum: says whether a reload swapped them
    ) -> None:
        self.model = model
        self.model_id = model_id
        self.validation = validation
        self.tier_names = [tier.name for tier in settings.tiers]
        self.positions = ladder_positions(model.tiers, self.tier_names)
        self.default_threshold = settings.router.default_threshold
        # Recalibrated models per tenant, with the positions of their own ladder.
        self.tenant_models: dict[str, tuple[RouterModel, tuple[int, ...]]] = {}
        self.routing: dict[str, TenantRouting] = {
            tenant.name: self._resolve(tenant, settings) for tenant in settings.tenants
        }

    # -- the decision (hot path) ------------------------------------------------------------
    def decide(self, request: Mapping[str, Any], kind: EndpointKind, tenant: Tenant) -> Decision:
        model, positions = self.tenant_models.get(tenant.name, (self.model, self.positions))
        score = model.score_one(request, kind)
        on_model = model.routing_proba_one(score)
        probabilities = tuple(on_model[position] for position in positions)
        thresholds = self.routing[tenant.name].thresholds
        allowed = tenant.allowed_tiers
        chosen = allowed[-1]
        for tier in allowed[:-1]:
            if probabilities[tier] >= thresholds[tier]:
                chosen = tier
                break
        return Decision(chosen, probabilities[chosen], "router", probabilities, score)

    # -- thresholds -------------------------------------------------------------------------
    def _resolve(self, tenant: TenantSettings, settings: Settings) -> TenantRouting:
        names = self.tier_names
        if tenant.thresholds is not None:
            # A tier the operator left out takes the default, equal-cost rule included: at
            # default_threshold an unnamed nvfp4 took every request before w4a16's own.
            default = self._default_thresholds(tenant, settings)
            return TenantRouting(
                tuple(
                    tenant.thresholds.get(name, fallback)
                    for name, fallback in zip(names[:-1], default, strict=True)
                ),
                "explicit",
            )
        if tenant.alpha is not None:
            tuned = self._tune(tenant.alpha, settings, allowed_tier_indices(tenant, names))
            if tuned is not None:
                return tuned
        return TenantRouting(self._default_thresholds(tenant, settings), "default")

    def _default_thresholds(self, tenant: TenantSettings, settings: Settings) -> tuple[float, ...]:
        """`default_threshold` for every tier but one that costs the same as the next tier
        the tenant may use (nvfp4 and w4a16 by default): that one is never more likely
        adequate, so choosing it gives quality away for nothing (1.0: never chosen, as
        `tune` does). Thresholds the operator set stay as set."""
        thresholds = [self.default_threshold] * (len(settings.tiers) - 1)
        allowed = allowed_tier_indices(tenant, self.tier_names)
        costs = [settings.tiers[tier].relative_cost for tier in allowed]
        for tier, saves in zip(allowed[:-1], saves_on_next(costs), strict=True):
            if not saves:
                thresholds[tier] = 1.0
        return tuple(thresholds)

    def _tune(
        self, alpha: float, settings: Settings, allowed: tuple[int, ...]
    ) -> TenantRouting | None:
        validation = complete_rows(self.validation)
        if validation is None:
            log.warning(
                "tenant alpha %.3f: the router model carries no validation rows that score "
                "every tier; using the default threshold %.2f until shadow labels arrive",
                alpha,
                self.default_threshold,
            )
            return None
        return tune_on(
            validation.proba,
            validation.correct,
            alpha,
            settings,
            self.positions,
            allowed=allowed,
            model_id=self.model_id,
        )

    def set_tenant_model(
        self, tenant: str, model: RouterModel, routing: TenantRouting | None = None
    ) -> None:
        """Swaps in a recalibrated model (and thresholds re-tuned on it) for one tenant."""
        self.tenant_models[tenant] = (model, ladder_positions(model.tiers, self.tier_names))
        if routing is not None:
            self.routing[tenant] = routing


def complete_rows(validation: Validation | None) -> Validation | None:
    """The validation rows that score every tier, None when there are none: `tune` compares
    the tiers on each row, and a model trained on shadow labels (one cheaper tier per row,
    the others NaN) has no such row, which `tune` refused and the gateway with it."""
    if validation is None:
        return None
    import numpy as np

    correct = np.asarray(validation.correct, dtype=np.float64)
    complete = ~np.isnan(correct).any(axis=1)
    if not complete.any():
        return None
    return Validation(np.asarray(validation.proba)[complete], correct[complete])


def tune_on(
    proba: Any,
    correct: Any,
    alpha: float,
    settings: Settings,
    positions: tuple[int, ...],
    *,
    allowed: tuple[int, ...] | None = None,
    model_id: str | None = None,
) -> TenantRouting:
    """`router_models.thresholds.tune` on validation data given on the model's ladder,
    evaluated on the gateway's ladder with the gateway's tier costs.

    Only the tenant's `allowed` tiers take part: the floor is alpha times the quality of
    the best tier it may use, and the uniform baseline is a tier it may use (a savings
    baseline on a forbidden tier showed a restricted tenant overspending for good).
    With `model_id`, the pre-test is kept for the next tenant, and the next reload, that
    reads the same model's columns at the same costs (`_PRETESTS`)."""
    import numpy as np

    from router_models.pretest import pretest
    from router_models.thresholds import tune

    tiers = tuple(range(len(settings.tiers))) if allowed is None else allowed
    never = tuple(1.0 for _ in settings.tiers[:-1])
    if len(tiers) == 1:
        return TenantRouting(never, "alpha", False, tiers[0], "one tier allowed: nothing to route")
    columns = [positions[tier] for tier in tiers]
    p = np.asarray(proba, dtype=np.float64)[:, columns]
    c = np.asarray(correct, dtype=np.float64)[:, columns]
    costs = [settings.tiers[tier].relative_cost for tier in tiers]
    result = tune(p, c, costs, alpha=alpha)
    if model_id is None:
        check = pretest(p, c, costs)
    else:
        check = _kept_pretest(
            (model_id, tuple(columns), tuple(costs)), lambda: pretest(p, c, costs)
        )
    thresholds = list(never)  # tiers the tenant may not use are never chosen anyway
    for tier, threshold in zip(tiers[:-1], result.thresholds, strict=True):
        thresholds[tier] = float(threshold)
    return TenantRouting(
        thresholds=tuple(thresholds),
        source="alpha",
        routing_pays=result.routing_pays,
        uniform_floor_tier=tiers[result.baseline.tier],
        note=result.message,
        pretest_pays=check.routing_pays,
        pretest=check.message,
    )


__all__ = ["RouterPolicy", "TenantRouting", "Validation", "ladder_positions", "tune_on"]
