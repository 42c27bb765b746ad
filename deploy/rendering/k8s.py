"""Kubernetes manifests: a base (the stateless gateway and monitoring) and one overlay per GPU.

The base holds what does not depend on the GPU: the gateway Deployment, Service, HPA, PDB,
the key Secret (placeholders), the engines' NetworkPolicy, ServiceMonitor, PodMonitor,
PrometheusRule and the Grafana dashboards. Each overlay adds what the planner decides for
its GPU: one vLLM Deployment and Service per tier, and the gateway ConfigMap that lists
those tiers with their flags.
"""

from __future__ import annotations

import json
from typing import Any, Final

from deploy.rendering import images
from deploy.rendering.dashboard_model import render as render_dashboard
from deploy.rendering.dashboards import DASHBOARDS
from deploy.rendering.gateway_config import (
    ADMIN_TOKEN_ENV,
    ENGINE_KEY_ENV,
    KEY_ENV,
    PORT,
    comment,
    gateway_settings,
    tier_host,
)
from deploy.rendering.output import header, to_yaml
from deploy.rendering.plan import DeployPlan, Target, TierSpec
from deploy.rendering.prometheus import ENGINE_JOB, prometheus_rule

NAMESPACE: Final = "tiergate"
PART_OF: Final = {"app.kubernetes.io/part-of": "tiergate"}
GATEWAY_SELECTOR: Final = {
    "app.kubernetes.io/name": "tiergate",
    "app.kubernetes.io/component": "gateway",
}
ENGINE_SELECTOR: Final = {"app.kubernetes.io/name": "vllm", **PART_OF}
SECRET: Final = "tiergate-keys"
# Where kube-prometheus-stack usually runs its Prometheus, and the label the operator puts
# on its pods: the engines admit its scrapes. docs/deploy.md asks operators to adjust both.
PROMETHEUS_NAMESPACE: Final = "monitoring"
PROMETHEUS_POD: Final = {"app.kubernetes.io/name": "prometheus"}
CONFIG: Final = "tiergate-config"
HTTP: Final = {"name": "http", "containerPort": PORT, "protocol": "TCP"}


def _meta(name: str, labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "labels": {**labels, **PART_OF}, **extra}


def _probe(path: str, period: int, failures: int, **extra: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        **extra,
    }


# -- base: the gateway ---------------------------------------------------------------------
def gateway_deployment() -> dict[str, Any]:
    container = {
        "name": "gateway",
        "image": images.GATEWAY,
        "args": ["serve", "--config", "/etc/tiergate/tiergate.yaml", "--host", "0.0.0.0"],
        "ports": [HTTP],
        # Tenant keys, the admin token and (proposed) TIERGATE_REDIS_URL for shared limits.
        "envFrom": [{"secretRef": {"name": SECRET}}],
        "readinessProbe": _probe("/ready", 5, 2),
        "livenessProbe": _probe("/health", 10, 3, initialDelaySeconds=5),
        # Give the endpoints controller time to drop the pod before the server drains.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/tiergate", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("tiergate", GATEWAY_SELECTOR),
        "spec": {
            # No `replicas`: the HPA owns the count (min 2), and a count here would reset
            # it on every `kubectl apply`.
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": GATEWAY_SELECTOR},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {"labels": {**GATEWAY_SELECTOR, **PART_OF}},
                "spec": {
                    # uvicorn drains in-flight streams for up to 30 s after SIGTERM.
                    "terminationGracePeriodSeconds": 45,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "runAsGroup": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": GATEWAY_SELECTOR},
                        }
                    ],
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": CONFIG}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def gateway_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta("tiergate", GATEWAY_SELECTOR),
        "spec": {
            "type": "ClusterIP",
            "selector": GATEWAY_SELECTOR,
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def gateway_hpa() -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta("tiergate", GATEWAY_SELECTOR),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tiergate"},
            "minReplicas": 2,
            "maxReplicas": 12,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 60},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def gateway_pdb() -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta("tiergate", GATEWAY_SELECTOR),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": GATEWAY_SELECTOR}},
    }


def gateway_secret() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(
            SECRET,
            GATEWAY_SELECTOR,
            annotations={
                "tiergate.io/placeholder": "Empty on purpose: no key authenticates until you "
                "replace this Secret (docs/deploy.md, Keys)."
            },
        ),
        "type": "Opaque",
        "stringData": {
            KEY_ENV["default"]: "",
            KEY_ENV["batch"]: "",
            ADMIN_TOKEN_ENV: "",
            # The engines' VLLM_API_KEY and the gateway's tier key; empty: no key on either.
            ENGINE_KEY_ENV: "",
        },
    }


def engine_network_policy() -> dict[str, Any]:
    """Only the gateway pods (and Prometheus) reach the engines: any other pod calling
    `tier-*` directly would skip tenant keys, limits and pins (the engine key is empty
    unless the operator sets one)."""
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}},
        "podSelector": {"matchLabels": PROMETHEUS_POD},
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta("vllm-tiers", {"app.kubernetes.io/name": "vllm"}),
        "spec": {
            "podSelector": {"matchLabels": ENGINE_SELECTOR},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    # A podSelector alone: the gateway pods of this namespace.
                    "from": [{"podSelector": {"matchLabels": GATEWAY_SELECTOR}}, prometheus],
                    "ports": [{"protocol": "TCP", "port": PORT}],
                }
            ],
        },
    }


# -- base: monitoring ----------------------------------------------------------------------
def service_monitor() -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta("tiergate", GATEWAY_SELECTOR),
        "spec": {
            # job="tiergate": the Service name, which the alert rules expect.
            "selector": {"matchLabels": GATEWAY_SELECTOR},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def pod_monitor() -> dict[str, Any]:
    relabel = [
        {"sourceLabels": ["__meta_kubernetes_pod_label_tiergate_io_tier"], "targetLabel": "tier"},
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_tiergate_io_precision"],
            "targetLabel": "precision",
        },
        {"targetLabel": "job", "replacement": ENGINE_JOB, "action": "replace"},
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta("vllm-tiers", {"app.kubernetes.io/name": "vllm"}),
        "spec": {
            "selector": {"matchLabels": ENGINE_SELECTOR},
            "podMetricsEndpoints": [
                {"port": "http", "path": "/metrics", "interval": "15s", "relabelings": relabel}
            ],
        },
    }


def dashboard_configmaps() -> list[dict[str, Any]]:
    # The Grafana sidecar of kube-prometheus-stack loads ConfigMaps labelled grafana_dashboard.
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(
                f"{d.uid}-dashboard",
                {"grafana_dashboard": "1", "app.kubernetes.io/name": "tiergate"},
            ),
            "data": {f"{d.uid}.json": json.dumps(render_dashboard(d), indent=1) + "\n"},
        }
        for d in DASHBOARDS
    ]


# -- overlays: per GPU ---------------------------------------------------------------------
def _engine_labels(tier: TierSpec) -> dict[str, str]:
    return {
        **ENGINE_SELECTOR,
        "app.kubernetes.io/instance": tier_host(tier.name),
        "tiergate.io/tier": tier.name,
        "tiergate.io/precision": tier.precision,
    }


def vllm_deployment(tier: TierSpec, target: Target) -> dict[str, Any]:
    labels = _engine_labels(tier)
    selector = {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": tier_host(tier.name),
    }
    container = {
        "name": "vllm",
        "image": images.VLLM,
        "command": ["vllm", "serve"],
        "args": tier.container_args(PORT),
        "env": [
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}
                },
            },
            {"name": "HF_HOME", "value": "/models/hf"},
            {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
            {
                "name": "VLLM_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": SECRET, "key": ENGINE_KEY_ENV}},
            },
        ],
        "ports": [HTTP],
        "resources": {
            "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "128Gi", "nvidia.com/gpu": "1"},
        },
        # Download and load take minutes: the startup probe allows 30 of them.
        # 5 s, not Kubernetes' 1 s default: an engine busy with a thousand streams can be
        # slow to answer /health, and a liveness restart costs minutes of weight loading.
        "startupProbe": _probe("/health", 10, 180, timeoutSeconds=5),
        "readinessProbe": _probe("/health", 10, 3, timeoutSeconds=5),
        "livenessProbe": _probe("/health", 20, 3, timeoutSeconds=5),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "models", "mountPath": "/models"},
        ],
    }
    notes = "; ".join(tier.notes)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(
            tier_host(tier.name), labels, annotations={"tiergate.io/planned-by": tier.source}
        ),
        "spec": {
            "replicas": 1,
            # One GPU per pod: a surge pod would wait for a free GPU, so replace in place.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": {**labels, **PART_OF},
                    "annotations": {"tiergate.io/precision-notes": notes} if notes else {},
                },
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": target.gpu_product},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "terminationGracePeriodSeconds": 60,
                    "containers": [container],
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                        # Use a PersistentVolumeClaim to keep weights across restarts.
                        {"name": "models", "emptyDir": {"sizeLimit": "200Gi"}},
                    ],
                },
            },
        },
    }


def vllm_service(tier: TierSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(tier_host(tier.name), _engine_labels(tier)),
        "spec": {
            "type": "ClusterIP",
            "selector": {
                "app.kubernetes.io/name": "vllm",
                "app.kubernetes.io/instance": tier_host(tier.name),
            },
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def gateway_configmap(plan: DeployPlan, target: Target) -> dict[str, Any]:
    text = header(comment(target)) + to_yaml(gateway_settings(plan, target))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(CONFIG, GATEWAY_SELECTOR),
        "data": {"tiergate.yaml": text},
    }


# -- files ---------------------------------------------------------------------------------
BASE_FILES: Final = {
    "gateway-secret.yaml": lambda: [gateway_secret()],
    "gateway-deployment.yaml": lambda: [gateway_deployment()],
    "gateway-service.yaml": lambda: [gateway_service()],
    "gateway-hpa.yaml": lambda: [gateway_hpa()],
    "gateway-pdb.yaml": lambda: [gateway_pdb()],
    "engine-networkpolicy.yaml": lambda: [engine_network_policy()],
    "servicemonitor.yaml": lambda: [service_monitor()],
    "podmonitor.yaml": lambda: [pod_monitor()],
    "prometheusrule.yaml": lambda: [prometheus_rule()],
    "grafana-dashboards.yaml": dashboard_configmaps,
}


def base_resources() -> dict[str, list[dict[str, Any]]]:
    return {name: build() for name, build in BASE_FILES.items()}


def overlay_resources(plan: DeployPlan, target: Target) -> dict[str, list[dict[str, Any]]]:
    tiers: list[dict[str, Any]] = []
    for tier in target.tiers:
        tiers += [vllm_deployment(tier, target), vllm_service(tier)]
    return {"gateway-config.yaml": [gateway_configmap(plan, target)], "vllm-tiers.yaml": tiers}


def kustomization(resources: list[str], namespace: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if namespace:
        doc["namespace"] = namespace
    doc["resources"] = resources
    return doc


__all__ = [
    "NAMESPACE",
    "base_resources",
    "kustomization",
    "overlay_resources",
]
