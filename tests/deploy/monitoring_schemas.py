"""JSON schemas for the prometheus-operator kinds we ship (monitoring.coreos.com/v1).

kubernetes-validate carries only the Kubernetes API's own schemas, so ServiceMonitor,
PodMonitor and PrometheusRule would be skipped with a warning. Rather than skip them, these
hand-written schemas cover the fields our manifests use, typed as in the operator's CRDs
(v0.7x+), and reject every field they do not know: a typo fails instead of being ignored by
the operator. They are a subset: a field the CRD has but we never use is refused too, which
is deliberate (add it here when a manifest starts using it).
"""

from __future__ import annotations

from typing import Any, Final

_DURATION: Final = {"type": "string", "pattern": r"^(0|(([0-9]+)(y|w|d|h|m|s|ms))+)$"}
_LABEL_NAME: Final = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
_STRING_MAP: Final = {"type": "object", "additionalProperties": {"type": "string"}}


def _closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_RELABEL: Final = _closed(
    {
        "sourceLabels": {"type": "array", "items": _LABEL_NAME},
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
        "action": {
            "type": "string",
            "enum": [
                "replace",
                "Replace",
                "keep",
                "Keep",
                "drop",
                "Drop",
                "hashmod",
                "HashMod",
                "labelmap",
                "LabelMap",
                "labeldrop",
                "LabelDrop",
                "labelkeep",
                "LabelKeep",
                "lowercase",
                "Lowercase",
                "uppercase",
                "Uppercase",
                "keepequal",
                "KeepEqual",
                "dropequal",
                "DropEqual",
            ],
        },
    }
)
_SELECTOR: Final = _closed(
    {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": _closed(
                {
                    "key": {"type": "string"},
                    "operator": {"type": "string"},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
                ("key", "operator"),
            ),
        },
    }
)
_ENDPOINT: Final = {
    "port": {"type": "string"},
    "path": {"type": "string"},
    "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": _DURATION,
    "scrapeTimeout": _DURATION,
    "honorLabels": {"type": "boolean"},
    "relabelings": {"type": "array", "items": _RELABEL},
    "metricRelabelings": {"type": "array", "items": _RELABEL},
}
_METADATA: Final = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "required": ["name"],
}


def _kind(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _closed(
        {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


_NAMESPACE_SELECTOR: Final = _closed(
    {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}
)
_RULE: Final = _closed(
    {
        "alert": {"type": "string"},
        "record": {"type": "string"},
        "expr": {"type": ["string", "integer"]},
        "for": _DURATION,
        "keep_firing_for": _DURATION,
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    ("expr",),
)

SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "ServiceMonitor": _kind(
        "ServiceMonitor",
        _closed(
            {
                "selector": _SELECTOR,
                "namespaceSelector": _NAMESPACE_SELECTOR,
                "jobLabel": {"type": "string"},
                "endpoints": {"type": "array", "minItems": 1, "items": _closed(_ENDPOINT)},
            },
            ("selector", "endpoints"),
        ),
    ),
    "PodMonitor": _kind(
        "PodMonitor",
        _closed(
            {
                "selector": _SELECTOR,
                "namespaceSelector": _NAMESPACE_SELECTOR,
                "jobLabel": {"type": "string"},
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _closed(_ENDPOINT),
                },
            },
            ("selector", "podMetricsEndpoints"),
        ),
    ),
    "PrometheusRule": _kind(
        "PrometheusRule",
        _closed(
            {
                "groups": {
                    "type": "array",
                    "items": _closed(
                        {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "rules": {"type": "array", "items": _RULE},
                        },
                        ("name", "rules"),
                    ),
                }
            },
            ("groups",),
        ),
    ),
}

__all__ = ["SCHEMAS"]
