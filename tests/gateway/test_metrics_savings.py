"""Savings accounting of GatewayMetrics when a reload has changed the ladder."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gateway.stats import Ladder, RequestRecord


def test_baselines_set_under_a_longer_ladder_do_not_break_the_flush() -> None:
    """Baselines set for a three-tier ladder (cheap, mid, top), a request served under the
    two-tier ladder it had before (cheap, top): the top_tier saving falls back to that ladder's top tier and the
    uniform_floor one (its tier is not in that ladder) is not credited, instead of an IndexError
    that loses every counter of the flush."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.tenant_top_tier["t"] = "mid"
    metrics.uniform_floor_tier["t"] = "mid"
    ladder = Ladder(names=("cheap", "top"), costs=(0.25, 1.0))
    record = RequestRecord(
        tenant="t",
        kind="chat",
        ladder=ladder,
        status=200,
        decided_tier=0,
        served_tier=0,
        reason="router",
        prompt_tokens=6,
        completion_tokens=4,
    )
    metrics.record(record)
    metrics.flush()

    def value(name: str, baseline: str) -> float | None:
        return registry.get_sample_value(name, {"tenant": "t", "baseline": baseline})

    assert value("tiergate_estimated_savings_total", "top_tier") == 10 * (1.0 - 0.25)
    assert value("tiergate_estimated_savings_total", "uniform_floor") is None


def baseline_costs_after_a_reload(served_under: Ladder) -> dict[str, float | None]:
    """The baseline costs a 10-token request at `served_under`'s cheapest tier is credited
    against, recorded after a reload that made bf16 tenant t's top tier and fp8 its floor."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.tenant_top_tier["t"] = "bf16"
    metrics.uniform_floor_tier["t"] = "fp8"
    metrics.record(
        RequestRecord(
            tenant="t", kind="chat", ladder=served_under, status=200, decided_tier=0,
            served_tier=0, reason="router", prompt_tokens=6, completion_tokens=4,
        )
    )  # fmt: skip
    metrics.flush()
    return {
        baseline: registry.get_sample_value(
            "tiergate_estimated_baseline_cost_total", {"tenant": "t", "baseline": baseline}
        )
        for baseline in ("top_tier", "uniform_floor")
    }


def test_baselines_are_the_named_tiers_of_the_ladder_a_request_was_served_under() -> None:
    """A request served before a reload that changed the ladder is credited against the
    baseline tiers' costs in its own ladder: the baselines were indices into the new ladder,
    so a record of the old one was credited against whichever tier sat at that index."""
    before = Ladder(
        names=("nvfp4", "w4a16", "fp8", "fp16", "bf16"), costs=(0.25, 0.25, 0.5, 1.0, 1.0)
    )
    baseline_cost = baseline_costs_after_a_reload(before)
    assert baseline_cost["top_tier"] == 10 * 1.0
    assert baseline_cost["uniform_floor"] == 10 * 0.5


def test_a_request_is_credited_against_the_baselines_of_its_own_configuration() -> None:
    """The ladder a request was routed under carries its tenants' baselines: a reload that
    moved the tenant's top tier and floor since then does not change what it is credited
    against (the metrics' current baselines serve only a tenant the ladder lacks)."""
    names, costs = ("nvfp4", "fp8", "bf16"), (0.25, 0.5, 1.0)
    routed = Ladder(names, costs, {"t": ("fp8", "nvfp4")})  # before the reload
    baseline_cost = baseline_costs_after_a_reload(routed)
    assert baseline_cost["top_tier"] == 10 * 0.5
    assert baseline_cost["uniform_floor"] == 10 * 0.25


def test_each_configurations_ladder_names_its_tenants_top_tier() -> None:
    from gateway.app import build_app
    from gateway.config import parse_settings

    def settings(allowed: list[str] | None) -> Any:
        tiers = [
            {"name": "a", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:9/v1"]},
            {"name": "b", "precision": "bf16", "endpoints": ["http://127.0.0.1:10/v1"]},
        ]
        tenant = {"name": "t", "api_keys": ["sk-t"], "allowed_tiers": allowed}
        return parse_settings({"model": "m", "tiers": tiers, "tenants": [tenant]})

    def baselines(app: Any) -> Any:
        return next(iter(app.runtime.hot_routes.values())).ladder.baselines

    app = build_app(settings(None), environ={})
    assert baselines(app) == {"t": ("b", None)}  # no alpha: no floor
    app.reload(settings(["a"]))
    assert baselines(app) == {"t": ("a", None)}
