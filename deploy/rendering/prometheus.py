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
# Where the compose Prometheus finds the gateway's /metrics token: its entrypoint writes
# $TIERGATE_METRICS_TOKEN there (compose.py), since Prometheus reads no variable in its
# configuration. Empty, it sends no credentials and the gateway, without a token, asks none.
METRICS_TOKEN_FILE: Final = "/run/tiergate/metrics_token"


def scrape_config(target: Target) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [
            {
                "job_name": GATEWAY_JOB,
                "metrics_path": "/metrics",
                "authorization": {"type": "Bearer", "credentials_file": METRICS_TOKEN_FILE},
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
    "The gateway job sends $TIERGATE_METRICS_TOKEN, which the compose files write to",
    f"{METRICS_TOKEN_FILE} when Prometheus starts.",
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


__all__ = [
    "ENGINE_JOB",
    "GATEWAY_JOB",
    "METRICS_TOKEN_FILE",
    "SCRAPE_COMMENT",
    "prometheus_rule",
    "scrape_config",
]
