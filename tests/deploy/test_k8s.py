"""The Kubernetes manifests: schema-valid, wired together, and what `kustomize build` makes.

Every resource that gets applied (the rendered overlays, which contain every resource of
base/ and overlays/ plus the namespace) is validated strictly with kubernetes-validate,
against Kubernetes 1.29 and the newest version it ships schemas for; the prometheus-operator
kinds, which it has no schema for, against tests/deploy/monitoring_schemas.py.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path
from typing import Any, Final

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.config import parse_settings
from tests.deploy.monitoring_schemas import SCHEMAS
from tests.deploy.support import DEPLOY
from tests.helpers import require_binary

K8S: Final = DEPLOY / "k8s"
TARGETS: Final = ("h200", "b200")
VERSIONS: Final = ("1.29.0", kubernetes_validate.latest_version())


@functools.cache
def _docs(path: Path) -> list[dict[str, Any]]:
    # Cached: callers only read (a test that edits one deep-copies it first).
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _sources() -> list[tuple[Path, dict[str, Any]]]:
    """Every resource in base/ and overlays/ (kustomization files aside)."""
    return [
        (path, doc)
        for folder in ("base", "overlays")
        for path in sorted((K8S / folder).rglob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in _docs(path)
    ]


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    """What gets applied: the rendered overlays (their sources differ only by namespace)."""
    return [
        (f"rendered/{target}.yaml:{d['kind']}/{d['metadata']['name']}", d)
        for target in TARGETS
        for d in _docs(K8S / "rendered" / f"{target}.yaml")
    ]


@functools.cache
def _rendered(target: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"]): d for d in _docs(K8S / "rendered" / f"{target}.yaml")
    }


def _validate(doc: dict[str, Any], version: str) -> None:
    schema = SCHEMAS.get(doc["kind"]) if doc["apiVersion"].startswith("monitoring.") else None
    if schema is not None:
        jsonschema.Draft202012Validator(schema).validate(doc)
    else:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_schema_valid(version: str) -> None:
    manifests = _manifests()
    assert len(manifests) > 30
    errors = []
    for name, doc in manifests:
        try:
            _validate(doc, version)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            errors.append(f"{name}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{name}: no schema ({exc.message})")
    assert not errors, "\n".join(errors)


def test_validation_catches_mistakes() -> None:
    """Negative controls: strict validation and our CRD schemas refuse unknown fields."""
    rendered = _rendered("h200")
    deployment = copy.deepcopy(rendered[("Deployment", "tiergate")])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
    monitor = copy.deepcopy(rendered[("PodMonitor", "vllm-tiers")])
    monitor["spec"]["podMetricsEndpoints"][0]["relabeling"] = []
    with pytest.raises(jsonschema.ValidationError):
        _validate(monitor, VERSIONS[-1])


def test_only_operator_kinds_lack_an_upstream_schema() -> None:
    missing = set()
    for _name, doc in _manifests():
        try:
            kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            missing.add(doc["kind"])
    assert missing == set(SCHEMAS)


def test_rendered_copies_cover_every_source_manifest() -> None:
    """So validating the rendered copies validates base/ and overlays/ too."""
    for path, doc in _sources():
        targets = TARGETS if "base" in path.parts else (path.parent.name,)
        for target in targets:
            built = _rendered(target)[(doc["kind"], doc["metadata"]["name"])]
            expected = copy.deepcopy(doc)
            expected["metadata"]["namespace"] = "tiergate"
            assert built == expected, f"{path}: {doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("target", TARGETS)
def test_kubectl_kustomize_agrees(target: str) -> None:
    """kubectl's own kustomize build equals the checked-in rendering. Debian's kubectl
    (1.20) is too old for these kustomizations, so the test uses the machine's (the CI image
    has one); without it the test fails in CI and skips elsewhere."""
    kubectl = require_binary("kubectl")
    built = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert [d for d in yaml.safe_load_all(built) if d] == _docs(K8S / "rendered" / f"{target}.yaml")


@pytest.mark.parametrize("target", TARGETS)
def test_gateway_is_stateless_replicated_and_probed(target: str) -> None:
    rendered = _rendered(target)
    deployment = rendered[("Deployment", "tiergate")]
    spec = deployment["spec"]
    # Replicated by the HPA alone: a count in the Deployment would reset its scale on apply.
    assert "replicas" not in spec
    hpa = rendered[("HorizontalPodAutoscaler", "tiergate")]["spec"]
    assert hpa["minReplicas"] >= 2 and hpa["scaleTargetRef"]["name"] == "tiergate"
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    # Stateless: only the ConfigMap and a scratch directory are mounted.
    kinds = {next(k for k in volume if k != "name") for volume in pod["volumes"]}
    assert kinds == {"configMap", "emptyDir"}
    assert container["envFrom"] == [{"secretRef": {"name": "tiergate-keys"}}]
    hpa = rendered[("HorizontalPodAutoscaler", "tiergate")]["spec"]
    assert hpa["minReplicas"] >= 2 and hpa["maxReplicas"] > hpa["minReplicas"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "tiergate",
    }
    service = rendered[("Service", "tiergate")]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pod_labels.items()
    monitor = rendered[("ServiceMonitor", "tiergate")]["spec"]
    service_labels = rendered[("Service", "tiergate")]["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= service_labels.items()
    assert {d["metadata"]["namespace"] for d in rendered.values()} == {"tiergate"}


@pytest.mark.parametrize("target", TARGETS)
def test_secret_holds_placeholders_only(target: str) -> None:
    secret = _rendered(target)[("Secret", "tiergate-keys")]
    assert set(secret["stringData"].values()) == {""}, "no real key may be committed"


@pytest.mark.parametrize("target", TARGETS)
def test_each_tier_gets_a_gpu_and_a_scraped_service(target: str) -> None:
    rendered = _rendered(target)
    config = rendered[("ConfigMap", "tiergate-config")]["data"]["tiergate.yaml"]
    settings = parse_settings(yaml.safe_load(config))
    pod_monitor = rendered[("PodMonitor", "vllm-tiers")]["spec"]
    for tier in settings.tiers:
        name = f"tier-{tier.name}"
        deployment = rendered[("Deployment", name)]
        pod = deployment["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        resources = container["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == "1"
        assert resources["requests"]["nvidia.com/gpu"] == "1"
        assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"].endswith(target.upper())
        # The gateway knows the flags the tier runs: the same argv as the container.
        assert container["args"][: len(tier.vllm_args or [])] == tier.vllm_args
        service = rendered[("Service", name)]
        assert tier.endpoints == [f"http://{name}:{service['spec']['ports'][0]['port']}/v1"]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert pod_monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert pod["metadata"]["labels"]["tiergate.io/tier"] == tier.name


@pytest.mark.parametrize("target", TARGETS)
def test_engines_and_gateway_read_one_engine_key(target: str) -> None:
    """Each engine's VLLM_API_KEY and the gateway's tier key come from the same entry of the
    gateway's Secret (which the gateway reads whole through envFrom)."""
    rendered = _rendered(target)
    secret = rendered[("Secret", "tiergate-keys")]
    config = rendered[("ConfigMap", "tiergate-config")]["data"]["tiergate.yaml"]
    settings = parse_settings(yaml.safe_load(config))
    for tier in settings.tiers:
        assert tier.api_key_env in secret["stringData"]
        pod = rendered[("Deployment", f"tier-{tier.name}")]["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        reference = {"name": "tiergate-keys", "key": tier.api_key_env}
        assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == reference


@pytest.mark.parametrize("target", TARGETS)
def test_the_gateway_plans_for_the_target_s_gpu(target: str) -> None:
    """The live planner (flag gauges, flag drift) costs flags on the GPU the tiers run on."""
    config = _rendered(target)[("ConfigMap", "tiergate-config")]["data"]["tiergate.yaml"]
    settings = parse_settings(yaml.safe_load(config))
    assert settings.planner.hardware.name.lower() == target


@pytest.mark.parametrize("target", TARGETS)
def test_the_gateway_replays_a_share_on_the_top_tier_for_calibration_labels(target: str) -> None:
    """Without shadow replays the Calibration dashboard and its alerts have no data."""
    config = _rendered(target)[("ConfigMap", "tiergate-config")]["data"]["tiergate.yaml"]
    shadow = parse_settings(yaml.safe_load(config)).shadow
    assert 0 < shadow.rate <= 0.05 and 0 < shadow.explore_rate <= 0.05


def test_nvfp4_is_native_on_b200_and_weight_only_on_h200() -> None:
    def notes(target: str) -> str:
        pod = _rendered(target)[("Deployment", "tier-nvfp4")]["spec"]["template"]
        return str(pod["metadata"]["annotations"]["tiergate.io/precision-notes"])

    assert "native W4A4" in notes("b200")
    assert "weight-only" in notes("h200") and "Marlin" in notes("h200")


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels only, as the manifests write them) against labels."""
    assert set(selector) <= {"matchLabels"}, selector
    return bool(selector.get("matchLabels", {}).items() <= labels.items())


@pytest.mark.parametrize("target", TARGETS)
def test_only_the_gateway_and_prometheus_reach_the_engines(target: str) -> None:
    """A pod that called `tier-*` directly would skip tenant keys, limits and pins: a
    NetworkPolicy selects exactly the engine pods and admits, on their port, the gateway's
    pods (same namespace) and Prometheus's (a namespace the operator names)."""
    rendered = _rendered(target)
    pods = {
        name: doc["spec"]["template"]["metadata"]["labels"]
        for (kind, name), doc in rendered.items()
        if kind == "Deployment"
    }
    engines = {name for name in pods if name.startswith("tier-")}
    assert engines and "tiergate" in pods
    policies = [doc for (kind, _), doc in rendered.items() if kind == "NetworkPolicy"]
    guarding = [p for p in policies if _matches(p["spec"]["podSelector"], pods["tier-bf16"])]
    assert len(guarding) == 1, "one NetworkPolicy for the engines"
    (policy,) = guarding
    spec = policy["spec"]
    assert {name for name, labels in pods.items() if _matches(spec["podSelector"], labels)} == (
        engines
    )
    assert "Ingress" in spec["policyTypes"]
    (rule,) = spec["ingress"]
    peers = rule["from"]
    # Every peer names both who and, past this namespace, where: none admits any pod.
    same_namespace = [p for p in peers if set(p) == {"podSelector"}]
    assert all(_matches(p["podSelector"], pods["tiergate"]) for p in same_namespace)
    assert same_namespace, "the gateway's pods are admitted"
    others = [p for p in peers if p not in same_namespace]
    for peer in others:
        assert set(peer) == {"namespaceSelector", "podSelector"}, peer
        assert peer["namespaceSelector"]["matchLabels"] and peer["podSelector"]["matchLabels"]
    assert [p["podSelector"]["matchLabels"] for p in others] == [
        {"app.kubernetes.io/name": "prometheus"}
    ]
    (container,) = rendered[("Deployment", "tier-bf16")]["spec"]["template"]["spec"]["containers"]
    assert rule["ports"] == [{"protocol": "TCP", "port": container["ports"][0]["containerPort"]}]
