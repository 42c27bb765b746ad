"""A small model of a Grafana dashboard and its rendering to Grafana's JSON (schema 39).

Panels are declared as data (title, PromQL, unit) and laid out in rows of 24 columns; the
JSON is what Grafana's file provisioning loads. Every panel reads the `${datasource}`
variable, so the dashboards work with any Prometheus data source, provisioned or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}
WINDOW: Final = "$__rate_interval"
TENANT: Final = 'tenant=~"$tenant"'
TIER: Final = 'tier=~"$tier"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    table: bool = False  # an instant query shown as table rows


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | table | heatmap
    width: int = 12
    height: int = 8
    stack: bool = False
    min: float | None = None
    max: float | None = None
    mappings: tuple[tuple[str, str], ...] = ()  # value -> text (states, flags)
    repeat: str | None = None  # a variable name: one panel per value


@dataclass(frozen=True)
class Row:
    title: str


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    items: tuple[Panel | Row, ...]
    variables: tuple[str, ...] = ("tenant", "tier")
    tags: tuple[str, ...] = field(default=("tiergate",))


_VARIABLE_QUERIES: Final = {
    "tenant": ("Tenant", "label_values(tiergate_requests_total, tenant)"),
    "tier": ("Tier", "label_values(tiergate_backend_up, tier)"),
}


def _datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def _query_variable(name: str) -> dict[str, Any]:
    label, query = _VARIABLE_QUERIES[name]
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-values"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
        "regex": "",
        "options": [],
    }


def _field_config(panel: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.mappings:
        defaults["mappings"] = [
            {
                "type": "value",
                "options": {
                    value: {"text": text, "index": i}
                    for i, (value, text) in enumerate(panel.mappings)
                },
            }
        ]
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 30 if panel.stack else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        }
    return {"defaults": defaults, "overrides": []}


def _options(panel: Panel) -> dict[str, Any]:
    if panel.kind == "stat":
        return {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "value_and_name",
            "justifyMode": "auto",
            "orientation": "auto",
        }
    if panel.kind == "table":
        return {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
    if panel.kind == "heatmap":
        return {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
            "yAxis": {"axisPlacement": "left"},
            "tooltip": {"mode": "single", "yHistogram": True},
            "legend": {"show": True},
        }
    return {
        "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                   "calcs": ["mean", "lastNotNull"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }  # fmt: skip


def _targets(panel: Panel) -> list[dict[str, Any]]:
    targets = []
    for index, query in enumerate(panel.queries):
        target: dict[str, Any] = {
            "datasource": DATASOURCE,
            "refId": chr(ord("A") + index),
            "expr": query.expr,
            "legendFormat": query.legend or "__auto",
        }
        if query.table:
            target.update({"format": "table", "instant": True, "range": False})
        elif panel.kind == "heatmap":
            target.update({"format": "heatmap", "range": True})
        else:
            target["range"] = True
        targets.append(target)
    return targets


def _transformations(panel: Panel) -> list[dict[str, Any]]:
    if panel.kind != "table":
        return []
    hidden = {"Time": True, "__name__": True, "instance": True, "job": True}
    # Merged instant queries come back as "Value #A", "Value #B"...: a legend names its column.
    several = len(panel.queries) > 1
    renamed = {
        f"Value #{chr(ord('A') + index)}" if several else "Value": query.legend
        for index, query in enumerate(panel.queries)
        if query.legend
    }
    return [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": hidden, "renameByName": renamed}},
    ]


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "targets": _targets(panel),
        "fieldConfig": _field_config(panel),
        "options": _options(panel),
    }
    transformations = _transformations(panel)
    if transformations:
        out["transformations"] = transformations
    if panel.repeat:
        out.update({"repeat": panel.repeat, "repeatDirection": "h", "maxPerRow": 3})
    return out


def render(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana's dashboard JSON; ids and grid positions follow the declaration order."""
    panels: list[dict[str, Any]] = []
    x = y = row_height = 0
    for panel_id, item in enumerate(dashboard.items, start=1):
        if isinstance(item, Row):
            y += row_height
            x = row_height = 0
            panels.append(
                {
                    "id": panel_id,
                    "type": "row",
                    "title": item.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            y += 1
            continue
        if x + item.width > 24:
            y += row_height
            x = row_height = 0
        panels.append(_panel_json(item, panel_id, x, y))
        x += item.width
        row_height = max(row_height, item.height)
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-3h", "to": "now"},
        "annotations": {"list": []},
        "links": [
            {"type": "dashboards", "tags": ["tiergate"], "asDropdown": True, "title": "tiergate"}
        ],
        "templating": {
            "list": [_datasource_variable(), *(_query_variable(v) for v in dashboard.variables)]
        },
        "panels": panels,
    }


__all__ = ["DATASOURCE", "TENANT", "TIER", "WINDOW", "Dashboard", "Panel", "Query", "Row", "render"]
