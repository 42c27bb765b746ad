"""Prometheus scrape configuration (compose) and the alert rules as a PrometheusRule (k8s).

Every vLLM target carries `tier` and `precision` labels: the dashboards join the engines'
`vllm:*` series to the gateway's `tiergate_*` ones on `tier`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

from deploy.rendering.gateway_config import PORT, tier_host
from deploy.rendering.plan import Target

ALERTS: Final = Path(__file__).resolve().parents[1] / "prometheus" / "alerts.yml"
GATEWAY_JOB: Final = "tiergate"
ENGINE_JOB: Final = "vllm"


def scrape_config(target: Target) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [
            {
                "job_name": GATEWAY_JOB,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [f"gateway:{PORT}"]}],
            },
            {
                "job_name": ENGINE_JOB,
                "metrics_path": "/metrics",
                "static_configs": [
                    {
                        "targets": [f"{tier_host(tier.name)}:{PORT}"],
                        "labels": {"tier": tier.name, "precision": tier.precision},
                    }
                    for tier in target.tiers
                ],
            },
        ],
    }


SCRAPE_COMMENT: Final = [
    "Scrapes the gateway (job tiergate) and every vLLM tier (job vllm, labelled with its",
    "tier). Add one target per gateway replica when you run several. Kubernetes uses the",
    "ServiceMonitor and PodMonitor in deploy/k8s/base instead.",
]


def prometheus_rule(alerts: Path = ALERTS) -> dict[str, Any]:
    groups = yaml.safe_load(alerts.read_text(encoding="utf-8"))["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "tiergate",
            "labels": {
                "app.kubernetes.io/name": "tiergate",
                "app.kubernetes.io/part-of": "tiergate",
            },
        },
        "spec": {"groups": groups},
    }


__all__ = ["ENGINE_JOB", "GATEWAY_JOB", "SCRAPE_COMMENT", "prometheus_rule", "scrape_config"]
