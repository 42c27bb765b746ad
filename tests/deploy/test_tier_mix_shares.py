"""The tier-mix panels, evaluated by promtool on the counters the gateway exports for a known
mix of answers, departures and engine refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gateway.stats import Attempt, Ladder, RequestRecord
from tests.deploy.support import concrete, counter_samples, panel_queries, promtool_expr_tests

LADDER: Final = Ladder(("nvfp4", "w4a16", "bf16"), (0.25, 0.5, 1.0))
STEP_S: Final = 15
STEPS: Final = 40


def _one_step_of_requests() -> dict[str, float]:
    """Tenant t: nvfp4 answers two requests and bf16 two; nvfp4 also had four whose client
    left while it generated (499, as the gateway records them) and refused one (400)."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    gone = [Attempt(0, "http://nvfp4/v1", "client_gone")]
    answers: list[tuple[int, int, list[Attempt]]] = [
        (0, 200, []), (2, 200, []), (0, 200, []), (2, 200, []), (0, 400, [])
    ]  # fmt: skip
    for served, status, attempts in answers + [(0, 499, gone)] * 4:
        record = RequestRecord(
            "t", "chat", LADDER, status, decided_tier=served, served_tier=served,
            reason="router", attempts=list(attempts), client_disconnected=status == 499,
        )  # fmt: skip
        metrics.record(record)
    metrics.flush()
    return counter_samples(registry, "tiergate_requests_")


@pytest.mark.parametrize("title", ["Tier mix: $tenant", "Tier mix per tenant (share of requests)"])
def test_the_tier_mix_is_of_answered_requests(tmp_path: Path, title: str) -> None:
    # Half of t's answers came from nvfp4, half from bf16: the departures and the refusal
    # that nvfp4 also had would make it 7 of 9.
    (expr,) = [
        concrete(query.expr)
        for query in panel_queries()
        if query.dashboard == "tiergate-traffic" and query.panel == title
    ]
    series = [
        {"series": name, "values": f"0+{value}x{STEPS}"}
        for name, value in _one_step_of_requests().items()
    ]
    tests = [
        {
            "expr": f"abs(({expr}) - 0.5) < bool 1e-9",
            "eval_time": f"{STEPS * STEP_S // 2}s",
            "exp_samples": [
                {"labels": _labels(title, tier), "value": 1} for tier in ("bf16", "nvfp4")
            ],
        }
    ]
    promtool_expr_tests(tmp_path, series, tests, STEP_S)


def _labels(title: str, tier: str) -> str:
    # The panel repeated per tenant keeps the tier; the other, the tenant and the tier.
    if title.startswith("Tier mix:"):
        return f'{{tier="{tier}"}}'
    return f'{{tenant="t", tier="{tier}"}}'
