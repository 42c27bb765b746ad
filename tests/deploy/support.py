"""Shared by the deploy tests: required binaries, the dashboards' queries, metric names."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from tests.helpers import require_binary

REPO: Final = Path(__file__).resolve().parents[2]
DEPLOY: Final = REPO / "deploy"
DASHBOARDS: Final = DEPLOY / "grafana" / "dashboards"
ALERTS: Final = DEPLOY / "prometheus" / "alerts.yml"
SCRAPE: Final = DEPLOY / "prometheus" / "prometheus.yml"

# vLLM 0.33 metric names as scraped (COST_MODEL.md c.2): counters with `_total`, histograms
# with `_bucket/_sum/_count`. A dashboard may only use these (or the gateway's).
_VLLM_GAUGES: Final = (
    "num_requests_running", "num_requests_waiting", "num_requests_waiting_by_reason",
    "kv_cache_usage_perc", "cache_config_info",
)  # fmt: skip
_VLLM_COUNTERS: Final = (
    "num_preemptions", "prefix_cache_queries", "prefix_cache_hits",
    "external_prefix_cache_queries", "external_prefix_cache_hits", "prompt_tokens",
    "prompt_tokens_by_source", "prompt_tokens_cached", "generation_tokens", "request_success",
    "spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
)  # fmt: skip
_VLLM_HISTOGRAMS: Final = (
    "request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
    "time_to_first_token_seconds", "inter_token_latency_seconds",
    "request_time_per_output_token_seconds", "e2e_request_latency_seconds",
    "request_queue_time_seconds",
)  # fmt: skip
VLLM_METRICS: Final = frozenset(
    [f"vllm:{n}" for n in _VLLM_GAUGES]
    + [f"vllm:{n}_total" for n in _VLLM_COUNTERS]
    + [f"vllm:{n}_{s}" for n in _VLLM_HISTOGRAMS for s in ("bucket", "sum", "count")]
)
# Series Prometheus itself adds to every target.
PROMETHEUS_SERIES: Final = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})

_SUFFIXES: Final = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "info": ("_info",),
    "gauge": ("",),
    "summary": ("_sum", "_count", ""),
}


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry can expose, including families with no children yet."""
    names: set[str] = set()
    family: Metric
    for family in registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def gateway_metric_names() -> set[str]:
    """The gateway's metric names, read from a freshly built app (nothing is hard-coded)."""
    from gateway.app import build_app
    from gateway.config import parse_settings

    settings = parse_settings(
        {
            "model": "m",
            "tiers": [
                {"name": "low", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:9/v1"]},
                {"name": "top", "precision": "bf16", "endpoints": ["http://127.0.0.1:10/v1"]},
            ],
            "tenants": [{"name": "t", "api_keys": ["k"]}],
        }
    )
    registry = CollectorRegistry()
    # Built, never started: no task runs and no connection opens.
    build_app(settings, registry=registry, environ={})
    return {n for n in exposed_names(registry) if n.startswith("tiergate_")}


# -- dashboards ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # dashboard uid
    panel: str  # panel title
    ref: str  # target refId
    expr: str  # as in the JSON, with Grafana variables
    table: bool

    @property
    def key(self) -> str:
        return f"{self.dashboard}/{self.panel}#{self.ref}"


def dashboards() -> dict[str, dict[str, Any]]:
    return {
        path.stem: json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(DASHBOARDS.glob("*.json"))
    }


def panel_queries() -> Iterator[PanelQuery]:
    for uid, dashboard in dashboards().items():
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                yield PanelQuery(
                    uid,
                    panel["title"],
                    target["refId"],
                    target["expr"],
                    target.get("format") == "table",
                )


def variable_queries() -> Iterator[tuple[str, str]]:
    for uid, dashboard in dashboards().items():
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                yield f"{uid}/${variable['name']}", variable["query"]["query"]


GRAFANA_VALUES: Final = {
    # What Grafana substitutes: "All" is the variables' allValue, windows are fixed here.
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "$tenant": ".*",
    "$tier": ".*",
}


def concrete(expr: str) -> str:
    """The PromQL Grafana would send, with the variables above substituted."""
    for name in sorted(GRAFANA_VALUES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VALUES[name])
    if "$" in expr:
        raise AssertionError(f"unsubstituted Grafana variable in {expr!r}")
    return expr


_KEYWORDS: Final = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
     "bool", "offset", "inf", "nan"}
)  # fmt: skip
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    return {m for m in _IDENTIFIER.findall(text) if m.lower() not in _KEYWORDS}


def counter_samples(registry: CollectorRegistry, prefix: str) -> dict[str, float]:
    """The registry's counter samples whose name starts with `prefix`, as promtool series."""
    return {
        sample.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())) + "}":
        sample.value
        for family in registry.collect() if family.type == "counter"
        for sample in family.samples if sample.name.startswith(prefix)
    }  # fmt: skip


def promtool_expr_tests(
    tmp_path: Path, series: list[dict[str, str]], tests: list[dict[str, Any]], step_s: int
) -> None:
    """`promtool test rules` with no rule file: each of `tests` (promql_expr_test entries)
    evaluated on `series` sampled every `step_s` seconds."""
    spec = {
        "rule_files": [],
        "evaluation_interval": f"{step_s}s",
        "tests": [{"interval": f"{step_s}s", "input_series": series, "promql_expr_test": tests}],
    }
    path = tmp_path / "expr_test.yml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = subprocess.run(
        [require_binary("promtool"), "test", "rules", path.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def label_values_query(query: str) -> str:
    """`label_values(metric, label)` as a PromQL query with one series per value."""
    match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
    assert match, f"unsupported variable query {query!r}"
    return f"count by ({match[2]}) ({match[1]})"


__all__ = [
    "ALERTS",
    "DASHBOARDS",
    "DEPLOY",
    "PROMETHEUS_SERIES",
    "REPO",
    "SCRAPE",
    "VLLM_METRICS",
    "PanelQuery",
    "concrete",
    "counter_samples",
    "dashboards",
    "exposed_names",
    "gateway_metric_names",
    "label_values_query",
    "metric_names",
    "panel_queries",
    "promtool_expr_tests",
    "require_binary",
    "variable_queries",
]
