"""Every dashboard query, run by a real Prometheus that scrapes a gateway under traffic.

Three simulated tiers (with prefix caching and n-gram speculation, so the engine panels have
data), the gateway in front of them, and the Debian `prometheus` binary scraping both every
second with deploy/prometheus/prometheus.yml and alerts.yml. Background streams keep every
tier busy while two waves of traffic (traffic.py), a few scrapes apart, give every counter an
increase inside the rate window. Then each panel's PromQL, with Grafana's variables
substituted, goes through /api/v1/query and must return at least one finite sample; the
alert rules must evaluate without error, and the error-rate alert must see the injected 5xx.
Every panel must have data: routing, the observer and planner, and shadow evaluation with
online recalibration are all switched on (FEATURE_SETTINGS).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from gateway.app import PolicyFactory
from gateway.config import Settings, parse_settings
from gateway.routing.factory import build_policy
from tests.deploy.promserver import PrometheusServer, local_scrape_config
from tests.deploy.support import (
    concrete,
    label_values_query,
    panel_queries,
    require_binary,
    variable_queries,
)
from tests.deploy.traffic import Traffic, tenants
from tests.helpers import MODEL, GatewayThread, Ladder

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(120)]

# -- how the gateway is started: the production router and every feature switched on --------
ROUTING_POLICY: Final[PolicyFactory] = build_policy
# Settings that switch on shadow evaluation and the live observer/planner (a `tenant:` key
# applies to every tenant).
FEATURE_SETTINGS: Final[dict[str, Any]] = {
    # Live observer and planner: every request sampled, scraped and planned twice a second.
    "observer": {
        "enabled": True,
        "sample_rate": 1.0,
        "window_s": 30.0,
        "bucket_s": 0.5,
        "scrape_interval_s": 0.5,
        "plan_interval_s": 0.5,
    },
    "planner": {"hardware": "h200"},  # the simulators' cost model
    # Shadow evaluation: replay every request, refit often.
    # The simulators decode deterministically whatever the temperature, so text judges apply.
    "shadow": {
        "rate": 1.0,
        "explore_rate": 1.0,
        "assume_deterministic": True,
        "min_labels": 5,
        "recalibrate_interval_s": 0.5,
    },
    "tenant:shadow_rate": 1.0,
}
SIM_FLAGS: Final = ("--prefix-caching", "--spec-decode")
METRICS_TOKEN: Final = "scrape-token"
# The same toggles as vLLM flags, so the gateway knows what the tiers run (flag gauges).
SIM_VLLM_ARGS: Final = [
    "--enable-prefix-caching",
    "--speculative-config",
    '{"method": "ngram", "num_speculative_tokens": 4}',
]


def _settings(ladder: Ladder) -> Settings:
    data: dict[str, Any] = {
        "model": MODEL,
        "tiers": [
            {
                "name": sim.precision,
                "precision": sim.precision,
                "endpoints": [f"{sim.url}/v1"],
                "served_model_name": sim.served_model_name,
                # What the simulators run with, for the running-flags gauges.
                "vllm_args": [
                    "--enable-prefix-caching",
                    "--speculative-config",
                    '{"method": "ngram", "num_speculative_tokens": 4}',
                ],
            }
            for sim in ladder.sims
        ],
        "tenants": tenants(),
        # The injected faults must not eject endpoints mid-wave (the background load hits
        # them too); circuits are tested in tests/gateway, here they only export state.
        "resilience": {"health_interval_s": 0.5, "failure_threshold": 1000},
    }
    for key, value in FEATURE_SETTINGS.items():
        if key.startswith("tenant:"):
            field = key.removeprefix("tenant:")
            for tenant in data["tenants"]:
                tenant[field] = value
        else:
            data[key] = value
    try:
        return parse_settings(data)
    except ValueError as exc:
        pytest.fail(f"FEATURE_SETTINGS no longer matches the gateway's settings: {exc}")


@dataclass
class Stack:
    prometheus: PrometheusServer
    gateway: GatewayThread
    settings: Settings


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = require_binary("prometheus")
    ladder = Ladder.start(extra_args=SIM_FLAGS)
    prometheus = None
    try:
        settings = _settings(ladder)
        # /metrics asks for the token, read as in compose; Prometheus scrapes with it.
        environ = {"TIERGATE_METRICS_TOKEN": METRICS_TOKEN}
        with GatewayThread(settings, policy_factory=ROUTING_POLICY, environ=environ) as gateway:
            engines = {sim.precision: f"127.0.0.1:{sim.port}" for sim in ladder.sims}
            workdir: Path = tmp_path_factory.mktemp("prometheus")
            token_file = workdir / "metrics_token"
            token_file.write_text(METRICS_TOKEN, encoding="utf-8")
            config = local_scrape_config(f"127.0.0.1:{gateway.port}", engines, token_file)
            prometheus = PrometheusServer(binary, config, workdir)
            prometheus.wait_ready()
            # Every target scraped once before the first request, so rates see the increase.
            prometheus.wait_for("up == 1", 1 + len(ladder.sims))
            traffic = Traffic(gateway.url, ladder)
            with traffic.background_load():
                for _ in range(2):
                    traffic.wave()
                    time.sleep(2.5)
            yield Stack(prometheus, gateway, settings)
    finally:
        if prometheus is not None:
            prometheus.stop()
        ladder.stop()


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def test_every_panel_returns_data(stack: Stack) -> None:
    empty = []
    for query in panel_queries():
        result = stack.prometheus.query(concrete(query.expr))
        if not _finite(result):
            empty.append(f"{query.key}: {result or 'no series'}\n  {concrete(query.expr)}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_template_variables_have_values(stack: Stack) -> None:
    for name, query in variable_queries():
        assert stack.prometheus.query(label_values_query(query)), name


def test_alert_rules_evaluate_on_live_series(stack: Stack) -> None:
    groups = stack.prometheus.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert rules, "alerts.yml was not loaded"
    broken = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
    assert not broken, broken
    active = {
        (alert["labels"]["alertname"], alert["labels"].get("tenant") or alert["labels"].get("tier"))
        for alert in stack.prometheus.api("alerts")["alerts"]
    }
    # The injected 5xx are a real error rate for the default tenant (the background load has
    # a tenant of its own): the alert sees it, pending until its `for`. No tier is down.
    assert ("TiergateHighErrorRate", "default") in active, active
    assert not {a for a in active if a[0] in {"TiergateTierDown", "TiergateGatewayDown"}}
