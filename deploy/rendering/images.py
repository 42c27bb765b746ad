"""Container images, pinned in one place (compose and Kubernetes use the same tags)."""

from __future__ import annotations

from typing import Final

from gateway import __version__

# vLLM 0.33: the release whose flags and metric names COST_MODEL.md c and d were read from.
VLLM: Final = "vllm/vllm-openai:v0.33.0"
# Prometheus 2.x: the rules are checked with the Debian promtool (2.42); 2.55 reads them as is.
PROMETHEUS: Final = "prom/prometheus:v2.55.1"
GRAFANA: Final = "grafana/grafana:11.3.0"
# Built from deploy/compose/Dockerfile; push it under your registry and set it in an overlay.
GATEWAY: Final = f"ghcr.io/tiergate/tiergate:{__version__}"
GATEWAY_LOCAL: Final = f"tiergate:{__version__}"

__all__ = ["GATEWAY", "GATEWAY_LOCAL", "GRAFANA", "PROMETHEUS", "VLLM"]
