"""The Grafana dashboards and provisioning, checked without a server: well-formed panels, and
every query reads metrics that exist (the gateway's, read from a built app, or vLLM's)."""

from __future__ import annotations

import re
from typing import Any, Final

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.deploy.support import (
    DEPLOY,
    PROMETHEUS_SERIES,
    VLLM_METRICS,
    concrete,
    dashboards,
    gateway_metric_names,
    metric_names,
    panel_queries,
    variable_queries,
)

DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def known_metrics() -> set[str]:
    return gateway_metric_names() | VLLM_METRICS | PROMETHEUS_SERIES


def test_every_query_reads_existing_metrics(known_metrics: set[str]) -> None:
    unknown = {}
    for query in panel_queries():
        names = metric_names(concrete(query.expr))
        if not names or not names <= known_metrics:
            unknown[query.key] = sorted(names - known_metrics) or "no metric"
    assert not unknown, unknown


def test_variables_read_existing_metrics(known_metrics: set[str]) -> None:
    for name, query in variable_queries():
        metric = query.split("(", 1)[1].split(",", 1)[0]
        assert metric in known_metrics, name


def _boxes_overlap(a: dict[str, int], b: dict[str, int]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


@pytest.mark.parametrize("uid", list(dashboards()))
def test_dashboard_is_well_formed(uid: str) -> None:
    dashboard: dict[str, Any] = dashboards()[uid]
    assert dashboard["uid"] == uid
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert variables[0] == "datasource"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for i, panel in enumerate(panels):
        box = panel["gridPos"]
        assert box["x"] >= 0 and box["x"] + box["w"] <= 24, panel["title"]
        assert not any(_boxes_overlap(box, other["gridPos"]) for other in panels[:i])
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE and panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval", "__range"}
            assert used <= set(variables), (panel["title"], used)
        if panel.get("repeat"):
            assert panel["repeat"] in variables


def test_the_issue_s_dashboards_are_there() -> None:
    """Tier mix per tenant, savings (both baselines), latency and overhead, calibration
    (predicted against observed), regime per tier, recommended against running flags."""
    exprs = {uid: " ".join(q.expr for q in panel_queries() if q.dashboard == uid)
             for uid in dashboards()}  # fmt: skip
    needs = {
        "tiergate-traffic": ["tiergate_requests_total", "tenant, tier"],
        "tiergate-savings": ['baseline="top_tier"', 'baseline="uniform_floor"'],
        "tiergate-latency": [
            "tiergate_request_duration_seconds_bucket",
            "tiergate_time_to_first_token_seconds_bucket",
            "tiergate_gateway_overhead_seconds_bucket",
        ],
        "tiergate-calibration": [
            "tiergate_shadow_predicted_adequacy_total",
            "tiergate_shadow_scored_labels_total",
            "tiergate_calibration_ece",
            "tiergate_calibration_drift",
        ],
        "tiergate-regime": [
            "tiergate_regime_concurrency",
            "tiergate_regime_prefix_share",
            "tiergate_regime_repetitiveness",
            "tiergate_flag_recommended",
            "tiergate_flag_running",
            "tiergate_flag_drift",
        ],
        "tiergate-backends": ["tiergate_backend_up", "tiergate_circuit_state"],
    }
    for uid, fragments in needs.items():
        for fragment in fragments:
            assert fragment in exprs[uid], (uid, fragment)


def test_provisioning_points_at_the_dashboards_and_prometheus() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "tiergate.yml").read_text())[
        "providers"
    ]
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.gpu.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"../grafana/dashboards:{provider['options']['path']}:ro" in mounts


def _summed_gauges() -> set[str]:
    """The gateway's gauges whose workers' values add up (each sees its share of traffic)."""
    from prometheus_client import Gauge

    from gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics(CollectorRegistry())
    return {
        gauge._name
        for gauge in vars(metrics).values()
        if isinstance(gauge, Gauge) and gauge._multiprocess_mode in ("sum", "livesum")
    }


def test_gauges_summed_over_workers_are_summed_over_replicas() -> None:
    """Replicas split the traffic as a replica's workers do: a maximum over them would show
    one replica's share (the observer's C of a tier behind two replicas, halved)."""
    summed = _summed_gauges()
    assert summed  # the regime's concurrency at least
    wrong = {}
    for query in panel_queries():
        for metric in summed & metric_names(concrete(query.expr)):
            aggregation = re.search(rf"(\w+)\s+by\s*\([^)]*\)\s*\(\s*{metric}\b", query.expr)
            if aggregation is None or aggregation.group(1) != "sum":
                wrong[query.key] = metric
    assert not wrong, wrong


def test_merged_table_columns_are_named_by_their_queries() -> None:
    """Grafana calls merged instant queries "Value #A", "Value #B"...: the flags table names
    its columns recommended, running and drift."""
    import json

    path = DEPLOY / "grafana" / "dashboards" / "tiergate-regime.json"
    panels = json.loads(path.read_text())["panels"]
    table = next(p for p in panels if p["title"] == "Recommended and running flags")
    organize = next(t for t in table["transformations"] if t["id"] == "organize")
    assert organize["options"]["renameByName"] == {
        "Value #A": "recommended",
        "Value #B": "running",
        "Value #C": "drift",
    }
