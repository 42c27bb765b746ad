"""The gateway's YAML for the deployed ladders (compose and the Kubernetes ConfigMap).

Tier endpoints are the service names both setups use (`tier-<name>:8000`). Keys never appear
here: each tenant reads them from an environment variable that a secret fills
(`api_keys_env`, comma-separated, plain or `sha256:<hex>`), and every tier reads the
engines' key from another (`api_key_env`). Every tier also carries the
planner's `vllm_args`, so the gateway knows the flags each tier runs with (flag drift).
"""

from __future__ import annotations

from typing import Any, Final

from deploy.rendering.plan import DeployPlan, Target
from gateway.config import DEFAULT_METRICS_TOKEN_ENV

PORT: Final = 8000
KEY_ENV: Final = {"default": "TIERGATE_KEYS_DEFAULT", "batch": "TIERGATE_KEYS_BATCH"}
ADMIN_TOKEN_ENV: Final = "TIERGATE_ADMIN_TOKEN"
# One secret for the engines' VLLM_API_KEY and the gateway's tier keys; empty: no key on
# either side.
ENGINE_KEY_ENV: Final = "TIERGATE_ENGINE_KEY"
# The gateway's /metrics token (the default `metrics.token_env`); Prometheus sends it too.
METRICS_TOKEN_ENV: Final = DEFAULT_METRICS_TOKEN_ENV
SHADOW_RATE: Final = 0.02


def tier_host(name: str) -> str:
    return f"tier-{name}"


def gateway_settings(plan: DeployPlan, target: Target) -> dict[str, Any]:
    names = [tier.name for tier in target.tiers]
    return {
        "model": plan.public_model,
        "tiers": [
            {
                "name": tier.name,
                "precision": tier.precision,
                "endpoints": [f"http://{tier_host(tier.name)}:{PORT}/v1"],
                "served_model_name": tier.served_model_name,
                "vllm_args": tier.vllm_args,
                "api_key_env": ENGINE_KEY_ENV,
            }
            for tier in target.tiers
        ],
        "tenants": [
            # Interactive traffic: every tier, pinning allowed.
            {"name": "default", "api_keys_env": KEY_ENV["default"]},
            # Offline batch jobs: never the top tier, no pinning, bounded rate.
            {
                "name": "batch",
                "api_keys_env": KEY_ENV["batch"],
                "allowed_tiers": names[:-1],
                "allow_pinning": False,
                "limits": {"requests_per_second": 50, "max_concurrency": 256},
            },
        ],
        "server": {"host": "0.0.0.0", "port": PORT},
        "admin": {"token_env": ADMIN_TOKEN_ENV},
        # The live planner's cost model (flag gauges, expected cost per token, flag drift):
        # without it the gateway plans for the default GPU whatever the target runs on.
        "planner": {"hardware": target.hardware},
        # Labels for the Calibration dashboard and its alerts (off by default, they would
        # show no data): 2% of cheaper-tier answers replayed on the top tier, and 2% of
        # top-tier requests on a cheaper one so that labels keep coming where the router
        # sends hard requests up. Replays take at most 10% of the top tier's slots.
        "shadow": {"rate": SHADOW_RATE, "explore_rate": SHADOW_RATE},
    }


def comment(target: Target) -> list[str]:
    lines = [
        f"Gateway configuration for the {target.name} ladder (tiers cheapest first).",
        f"Keys: ${KEY_ENV['default']} and ${KEY_ENV['batch']} (comma-separated, plain or",
        f"sha256:<hex>); admin API: ${ADMIN_TOKEN_ENV}; the engines' key (their VLLM_API_KEY):",
        f"${ENGINE_KEY_ENV}, empty for none. None of them lives in this file.",
        "",
    ]
    for tier in target.tiers:
        lines.append(f"{tier.name}: {tier.source}")
    return lines


__all__ = [
    "ADMIN_TOKEN_ENV",
    "ENGINE_KEY_ENV",
    "KEY_ENV",
    "PORT",
    "comment",
    "gateway_settings",
    "tier_host",
]
