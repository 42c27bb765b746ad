"""The two compose files: three real vLLM tiers on one GPU host, or three simulated ones.

Both run the same gateway configuration (deploy/compose/tiergate.yaml) against services
named `tier-<name>`, and the same Prometheus and Grafana provisioning. Paths are relative to
deploy/compose/.
"""

from __future__ import annotations

from typing import Any

from deploy.rendering import images
from deploy.rendering.gateway_config import (
    ADMIN_TOKEN_ENV,
    ENGINE_KEY_ENV,
    KEY_ENV,
    METRICS_TOKEN_ENV,
    PORT,
    tier_host,
)
from deploy.rendering.plan import DeployPlan, Target, TierSpec
from deploy.rendering.prometheus import METRICS_TOKEN_FILE
from gateway.launcher import SIM_API_KEY_ENV

CONFIG_MOUNT = "./tiergate.yaml:/etc/tiergate/tiergate.yaml:ro"
# Every service on the local image carries the build, so no service tries to pull it.
BUILD = {"context": "../..", "dockerfile": "deploy/compose/Dockerfile"}
GATEWAY_COMMAND = ["serve", "--config", "/etc/tiergate/tiergate.yaml", "--host", "0.0.0.0"]
# The engines and the gateway read one variable: empty (the default) means no key anywhere.
ENGINE_KEY = f"${{{ENGINE_KEY_ENV}:-}}"
# The gateway's /metrics token and Prometheus's copy of it: empty (the default), /metrics is
# open to whoever reaches the port.
METRICS_TOKEN = f"${{{METRICS_TOKEN_ENV}:-}}"
# Prometheus reads no variable in its configuration: the entrypoint writes the token to the
# file its gateway job reads (on a tmpfs, so it never lands on disk), then runs Prometheus
# with the service's command as its arguments. `$$` is compose's escape for `$`.
TOKEN_DIR = METRICS_TOKEN_FILE.rsplit("/", 1)[0]
PROMETHEUS_ENTRYPOINT = [
    "/bin/sh",
    "-c",
    f"umask 077 && printf '%s' \"$${METRICS_TOKEN_ENV}\" > {METRICS_TOKEN_FILE}"
    ' && exec /bin/prometheus "$$@"',
    "prometheus",
]


def _escape(value: str) -> str:
    # Compose interpolates `$`; a flag value must reach vLLM unchanged.
    return value.replace("$", "$$")


def _http_check(url: str, start_period: str) -> dict[str, Any]:
    probe = f"import urllib.request; urllib.request.urlopen('{url}', timeout=5)"
    return {
        "test": ["CMD", "python3", "-c", probe],
        "interval": "15s",
        "timeout": "10s",
        "retries": 5,
        "start_period": start_period,
    }


def _gateway(target: Target, environment: dict[str, str], bind: str = "") -> dict[str, Any]:
    """`bind`: the host address the port is published on (empty: every interface)."""
    return {
        "build": BUILD,
        "image": images.GATEWAY_LOCAL,
        "command": GATEWAY_COMMAND,
        "environment": environment,
        "volumes": [CONFIG_MOUNT],
        "ports": [f"{bind}:{PORT}:{PORT}" if bind else f"{PORT}:{PORT}"],
        "depends_on": [tier_host(t.name) for t in target.tiers],
        "healthcheck": _http_check(f"http://127.0.0.1:{PORT}/ready", "30s"),
        "restart": "unless-stopped",
    }


def _monitoring(grafana_env: dict[str, str]) -> dict[str, Any]:
    return {
        "prometheus": {
            "image": images.PROMETHEUS,
            "entrypoint": PROMETHEUS_ENTRYPOINT,
            "command": [
                "--config.file=/etc/prometheus/prometheus.yml",
                "--storage.tsdb.retention.time=15d",
            ],
            "environment": {METRICS_TOKEN_ENV: METRICS_TOKEN},
            "volumes": ["../prometheus:/etc/prometheus:ro", "prometheus-data:/prometheus"],
            "tmpfs": [TOKEN_DIR],
            "ports": ["127.0.0.1:9090:9090"],
            "restart": "unless-stopped",
        },
        "grafana": {
            "image": images.GRAFANA,
            "environment": grafana_env,
            "volumes": [
                "../grafana/provisioning:/etc/grafana/provisioning:ro",
                "../grafana/dashboards:/var/lib/grafana/dashboards:ro",
                "grafana-data:/var/lib/grafana",
            ],
            "ports": ["127.0.0.1:3000:3000"],
            "depends_on": ["prometheus"],
            "restart": "unless-stopped",
        },
    }


def _vllm(tier: TierSpec, gpu: int) -> dict[str, Any]:
    return {
        "image": images.VLLM,
        "entrypoint": ["vllm", "serve"],
        "command": [_escape(a) for a in tier.container_args(PORT)],
        "environment": {
            "HF_TOKEN": "${HF_TOKEN:-}",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_API_KEY": ENGINE_KEY,
        },
        "volumes": ["${HF_CACHE_DIR:-~/.cache/huggingface}:/root/.cache/huggingface"],
        # vLLM's workers share tensors through /dev/shm.
        "ipc": "host",
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [
                        {
                            "driver": "nvidia",
                            "device_ids": [f"${{TIERGATE_GPU_{tier.name.upper()}:-{gpu}}}"],
                            "capabilities": ["gpu"],
                        }
                    ]
                }
            }
        },
        # Loading 30B weights takes minutes; the gateway's own health checks cover the gap.
        "healthcheck": _http_check(f"http://127.0.0.1:{PORT}/health", "900s"),
        "labels": {"io.tiergate.tier": tier.name, "io.tiergate.precision": tier.precision},
        "restart": "unless-stopped",
    }


def _sim(tier: TierSpec, hardware: str) -> dict[str, Any]:
    toggles = [
        *(["--spec-decode"] if tier.speculative else []),
        *(["--prefix-caching"] if tier.prefix_caching else []),
    ]
    command = [
        "sim",
        "--precision",
        tier.precision,
        "--served-model-name",
        tier.served_model_name,
        "--hardware",
        hardware,
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        *toggles,
    ]
    return {
        "build": BUILD,
        "image": images.GATEWAY_LOCAL,
        "command": command,
        "environment": {SIM_API_KEY_ENV: ENGINE_KEY},
        "healthcheck": _http_check(f"http://127.0.0.1:{PORT}/health", "10s"),
        "labels": {"io.tiergate.tier": tier.name, "io.tiergate.precision": tier.precision},
        "restart": "unless-stopped",
    }


def gpu_compose(plan: DeployPlan) -> dict[str, Any]:
    target = plan.compose
    services: dict[str, Any] = {
        tier_host(t.name): _vllm(t, gpu) for gpu, t in enumerate(target.tiers)
    }
    services["gateway"] = _gateway(
        target,
        {
            KEY_ENV[
                "default"
            ]: f"${{{KEY_ENV['default']}:?set {KEY_ENV['default']} (see .env.example)}}",
            KEY_ENV["batch"]: f"${{{KEY_ENV['batch']}:-}}",
            ADMIN_TOKEN_ENV: f"${{{ADMIN_TOKEN_ENV}:-}}",
            ENGINE_KEY_ENV: ENGINE_KEY,
            METRICS_TOKEN_ENV: METRICS_TOKEN,
        },
    )
    services.update(
        _monitoring(
            {
                "GF_SECURITY_ADMIN_PASSWORD": "${GRAFANA_ADMIN_PASSWORD:?set it in .env}",
                "GF_USERS_ALLOW_SIGN_UP": "false",
            }
        )
    )
    return {"services": services, "volumes": {"prometheus-data": {}, "grafana-data": {}}}


def cpu_compose(plan: DeployPlan) -> dict[str, Any]:
    target = plan.compose
    services: dict[str, Any] = {tier_host(t.name): _sim(t, target.hardware) for t in target.tiers}
    services["gateway"] = _gateway(
        target,
        {
            # The one plaintext key in the repository: local development only.
            KEY_ENV["default"]: "sk-local-dev",
            KEY_ENV["batch"]: f"${{{KEY_ENV['batch']}:-}}",
            ADMIN_TOKEN_ENV: f"${{{ADMIN_TOKEN_ENV}:-}}",
            ENGINE_KEY_ENV: ENGINE_KEY,
            METRICS_TOKEN_ENV: METRICS_TOKEN,
        },
        # Loopback only: this profile's key is committed in the repository.
        bind="127.0.0.1",
    )
    services.update(
        _monitoring(
            {
                "GF_AUTH_ANONYMOUS_ENABLED": "true",
                "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
                "GF_USERS_ALLOW_SIGN_UP": "false",
            }
        )
    )
    return {"services": services, "volumes": {"prometheus-data": {}, "grafana-data": {}}}


def gpu_comment(plan: DeployPlan) -> list[str]:
    target = plan.compose
    lines = [
        f"One GPU host, {len(target.tiers)} GPUs: the {plan.public_model} ladder on {target.name},",
        "one vLLM per precision of the same checkpoint, the gateway, Prometheus and Grafana.",
        "",
        "  cp deploy/compose/.env.example deploy/compose/.env   # then fill in the secrets",
        "  docker-compose -f deploy/compose/docker-compose.gpu.yml up -d",
        "",
        "GPUs: TIERGATE_GPU_<TIER> picks the device for each tier (defaults 0, 1, 2).",
        "Planned flags per tier (the planner's `vllm serve` lines):",
    ]
    for tier in target.tiers:
        lines += [f"  {tier.name}: {tier.source}", f"    {tier.command}"]
        lines += [f"    note: {note}" for note in tier.notes]
    lines += [
        "NVFP4 runs native W4A4 FP4 GEMMs only on Blackwell (B200, SM100); on H200 (SM90) vLLM",
        "serves the same checkpoint weight-only through Marlin: memory and bandwidth of 4-bit",
        "weights, BF16 compute (COST_MODEL.md d.4). Set compose_target in deploy/plan.yaml and",
        "re-render for a B200 host.",
    ]
    return lines


CPU_COMMENT = [
    "CPU only: three simulated vLLM tiers (`tiergate sim`, the same flags' toggles as the GPU",
    "ladder), the gateway, Prometheus and Grafana. Dev key: sk-local-dev.",
    "",
    "  docker-compose -f deploy/compose/docker-compose.cpu.yml up -d --build",
    "  Gateway http://127.0.0.1:8000/v1, Grafana http://127.0.0.1:3000, Prometheus :9090",
]


__all__ = ["CPU_COMMENT", "cpu_compose", "gpu_comment", "gpu_compose"]
