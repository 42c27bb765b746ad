"""Savings accounting of GatewayMetrics when a reload has changed the ladder."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gateway.stats import Ladder, RequestRecord


def test_baselines_set_under_a_longer_ladder_do_not_break_the_flush() -> None:
    """Baselines recorded for a three-tier ladder, a request served under the two-tier
    ladder a reload left: the top_tier saving falls back to that ladder's top tier and the
    uniform_floor one (its tier no longer exists) is not credited, instead of an IndexError
    that loses every counter of the flush."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.tenant_top_tier["t"] = 2
    metrics.uniform_floor_tier["t"] = 2
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
