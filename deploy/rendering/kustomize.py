"""`kustomize build` for the subset the tiergate tree uses: `resources` and `namespace`.

`kubectl kustomize` is not on every machine that runs the tests, so the rendered copies under
deploy/k8s/rendered come from this. Any other kustomization field is refused rather than
ignored; where kubectl is installed, a test checks that both builds agree.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

_SUPPORTED: Final = {"apiVersion", "kind", "resources", "namespace"}
# kustomize's legacy output order: these kinds first, in this order, then the rest by kind.
_FIRST: Final = (
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
    "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
    "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
    "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget",
)  # fmt: skip
_LAST: Final = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
_CLUSTER_SCOPED: Final = {
    "Namespace", "StorageClass", "CustomResourceDefinition", "ClusterRole",
    "ClusterRoleBinding", "PriorityClass", "PersistentVolume",
}  # fmt: skip

Reader = Callable[[Path], str]


def _disk(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _load(directory: Path, read: Reader) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load(read(directory / "kustomization.yaml"))
    unknown = set(kustomization) - _SUPPORTED
    if unknown:
        raise ValueError(f"{directory}: kustomization fields {sorted(unknown)} not supported here")
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.suffix in {".yaml", ".yml"}:
            docs += [d for d in yaml.safe_load_all(read(path)) if d]
        else:
            docs += _load(path, read)
    namespace = kustomization.get("namespace")
    if namespace:
        for doc in docs:
            if doc["kind"] not in _CLUSTER_SCOPED:
                doc.setdefault("metadata", {})["namespace"] = namespace
    return docs


def _order(doc: dict[str, Any]) -> tuple[int, str, str]:
    kind = doc["kind"]
    if kind in _FIRST:
        rank = _FIRST.index(kind)
    elif kind in _LAST:
        rank = len(_FIRST) + 1 + _LAST.index(kind)
    else:
        rank = len(_FIRST)
    return (
        rank,
        f"{doc['apiVersion']}/{kind}" if rank == len(_FIRST) else "",
        doc["metadata"]["name"],
    )


def build(directory: Path, read: Reader = _disk) -> list[dict[str, Any]]:
    """The resources of a kustomization directory, namespaced and in kustomize's order."""
    docs = _load(directory.resolve(), read)
    seen: set[tuple[str, str]] = set()
    for doc in docs:
        key = (doc["kind"], doc["metadata"]["name"])
        if key in seen:
            raise ValueError(f"{directory}: {key[0]}/{key[1]} is declared twice")
        seen.add(key)
    return sorted(docs, key=_order)


__all__ = ["build"]
