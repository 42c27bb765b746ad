"""Renders every generated deploy file from deploy/plan.yaml and the planner.

    python -m deploy.render           # (re)write the files
    python -m deploy.render --check   # exit 1 and list the files that differ (CI, tests)

Written: the Grafana dashboards, the Prometheus scrape configuration, both compose files and
their gateway configuration, the Kubernetes base, overlays and their rendered copies.
Hand-written, read as inputs: deploy/plan.yaml, deploy/prometheus/alerts.yml.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent


def render_all() -> dict[Path, str]:
    """Every generated file, by absolute path, with its exact content."""
    from deploy.rendering import compose, k8s, kustomize
    from deploy.rendering.dashboard_model import render as render_dashboard
    from deploy.rendering.dashboards import DASHBOARDS
    from deploy.rendering.gateway_config import comment, gateway_settings
    from deploy.rendering.output import json_file, yaml_file, yaml_stream
    from deploy.rendering.plan import load_plan
    from deploy.rendering.prometheus import SCRAPE_COMMENT, scrape_config

    plan = load_plan()
    out: dict[Path, str] = {}
    for dashboard in DASHBOARDS:
        out[DEPLOY / "grafana" / "dashboards" / f"{dashboard.uid}.json"] = json_file(
            render_dashboard(dashboard)
        )
    out[DEPLOY / "prometheus" / "prometheus.yml"] = yaml_file(
        scrape_config(plan.compose), SCRAPE_COMMENT
    )
    out[DEPLOY / "compose" / "tiergate.yaml"] = yaml_file(
        gateway_settings(plan, plan.compose), comment(plan.compose)
    )
    out[DEPLOY / "compose" / "docker-compose.gpu.yml"] = yaml_file(
        compose.gpu_compose(plan), compose.gpu_comment(plan)
    )
    out[DEPLOY / "compose" / "docker-compose.cpu.yml"] = yaml_file(
        compose.cpu_compose(plan), compose.CPU_COMMENT
    )

    k8s_dir = DEPLOY / "k8s"
    base = k8s.base_resources()
    for name, docs in base.items():
        out[k8s_dir / "base" / name] = yaml_stream(docs)
    out[k8s_dir / "base" / "kustomization.yaml"] = yaml_file(k8s.kustomization(list(base)))
    for target in plan.targets.values():
        overlay_dir = k8s_dir / "overlays" / target.name
        files = k8s.overlay_resources(plan, target)
        for name, docs in files.items():
            out[overlay_dir / name] = yaml_stream(docs, [f"{target.name}: planned for this GPU."])
        out[overlay_dir / "kustomization.yaml"] = yaml_file(
            k8s.kustomization(["../../base", *files], k8s.NAMESPACE)
        )

    def read(path: Path) -> str:
        return out[path] if path in out else path.read_text(encoding="utf-8")

    for target in plan.targets.values():
        docs = kustomize.build(k8s_dir / "overlays" / target.name, read)
        out[k8s_dir / "rendered" / f"{target.name}.yaml"] = yaml_stream(
            docs, [f"`kubectl kustomize deploy/k8s/overlays/{target.name}`, as plain YAML."]
        )
    return out


def stale_files(rendered: dict[Path, str]) -> list[Path]:
    """Generated files whose checked-in content differs from a fresh rendering."""
    return [
        path
        for path, text in rendered.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    try:
        rendered = render_all()
    except (ValueError, KeyError, OSError, yaml.YAMLError) as exc:
        # A bad plan or overlay is the operator's input: one line, not a traceback.
        print(f"deploy.render: error: {exc}", file=sys.stderr)
        return 2
    stale = stale_files(rendered)
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(REPO)}", file=sys.stderr)
        if stale:
            print("run `python -m deploy.render` and commit the result", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered[path], encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    if not __package__:
        # `python deploy/render.py` works too: make the repository importable.
        sys.path.insert(0, str(REPO))
    raise SystemExit(main())
