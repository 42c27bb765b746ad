"""The Savings dashboard's shares, evaluated by promtool on the counters the gateway exports
for a known mix of routed and pinned requests."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gateway.stats import Ladder, RequestRecord
from tests.deploy.support import concrete, counter_samples, panel_queries, promtool_expr_tests

LADDER: Final = Ladder(("nvfp4", "w4a16", "bf16"), (0.25, 0.5, 1.0))
STEP_S: Final = 15


def _one_step_of_counters(shadow_cost: float = 0.0) -> dict[str, float]:
    """Counter samples after one step of traffic from tenant t (floor w4a16, top bf16):
    six routed to nvfp4, two routed to bf16, one pinned to bf16; 100 tokens each; and
    shadow replays costing `shadow_cost`."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.uniform_floor_tier["t"] = "w4a16"
    metrics.tenant_top_tier["t"] = "bf16"
    for served, reason in [(0, "router")] * 6 + [(2, "router")] * 2 + [(2, "pinned")]:
        metrics.record(
            RequestRecord(
                "t", "chat", LADDER, 200, decided_tier=served, served_tier=served,
                reason=reason, prompt_tokens=60, completion_tokens=40,
            )
        )  # fmt: skip
    if shadow_cost:
        metrics.record_shadow_cost("t", shadow_cost)
    metrics.flush()
    return counter_samples(registry, "tiergate_estimated_")


def test_savings_shares_are_of_the_baselines_cost_for_the_routed_requests(
    tmp_path: Path,
) -> None:
    # Routed: nvfp4 costs 150 where w4a16 would cost 300 and bf16 600; bf16 costs 200 where
    # w4a16 would cost 100. Net against the floor 150 - 100 of 400, against the top tier
    # 450 of 800. The pinned request costs 100 and is no part of either.
    expected = {"floor (share of its cost)": 0.125, "bill (precision and routing": 0.5625}
    _assert_panels(tmp_path, _one_step_of_counters(), expected)


def test_totals_over_the_range_are_net_of_shadow_replays(tmp_path: Path) -> None:
    # As above, plus 50 of shadow replays per step, overspend against both baselines: net
    # against the floor 150 - 100 - 50 = 0, against the top tier 450 - 50 = 400 per step,
    # over the 20 steps of the 5-minute range the tests substitute.
    expected = {
        "over the range (net, against the uniform floor)": 0.0,
        "bill over the range": 400.0 * 20,
    }
    _assert_panels(tmp_path, _one_step_of_counters(shadow_cost=50.0), expected)


def _assert_panels(
    tmp_path: Path, counters: dict[str, float], expected: dict[str, float], steps: int = 40
) -> None:
    """promtool evaluates each Savings panel named by a fragment of its title halfway
    through `steps` steps of `counters`."""
    series = [{"series": name, "values": f"0+{value}x{steps}"} for name, value in counters.items()]
    panels = {
        query.panel: concrete(query.expr)
        for query in panel_queries()
        if query.dashboard == "tiergate-savings"
    }
    tests = []
    for fragment, value in expected.items():
        (expr,) = [expr for panel, expr in panels.items() if fragment in panel]
        tests.append(
            {
                # 1 where the panel shows the value (rate's extrapolation leaves float noise).
                "expr": f"abs(({expr}) - {value}) < bool {1e-9 * max(1.0, abs(value))}",
                "eval_time": f"{steps * STEP_S // 2}s",
                "exp_samples": [{"labels": '{tenant="t"}', "value": 1}],
            }
        )
    promtool_expr_tests(tmp_path, series, tests, STEP_S)
