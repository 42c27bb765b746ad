"""Per-tier `vllm serve` arguments for each deploy target, from the planner.

Nothing here chooses a flag: `plan_tier` (the same call `tiergate plan --from-gateway` makes
for a tier whose precision the ladder fixes) decides speculation and prefix caching, and
`vllm_serve_args` writes the argv. A `tiergate plan --write` overlay, when present, is taken
verbatim instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.planner.params import settings_from_mapping
from gateway.planner.planner import Regime, plan_tier
from gateway.planner.vllm_args import precision_notes, serve_command

DEPLOY = Path(__file__).resolve().parents[1]
PLAN_FILE = DEPLOY / "plan.yaml"
PLANS_DIR = DEPLOY / "plans"


@dataclass(frozen=True)
class TierSpec:
    """One rung of the ladder as the deploy files need it."""

    name: str
    precision: str
    served_model_name: str
    vllm_args: list[str]  # the argv after `vllm serve`, first item the checkpoint
    speculative: bool
    prefix_caching: bool
    source: str  # where the flags came from, written into the files as a comment
    notes: list[str]

    @property
    def command(self) -> str:
        return serve_command(self.vllm_args)

    def container_args(self, port: int) -> list[str]:
        """The planner's argv plus what only the deployment knows: name, address, port."""
        extra = ["--served-model-name", self.served_model_name, "--host", "0.0.0.0"]
        return [*self.vllm_args, *extra, "--port", str(port)]


@dataclass(frozen=True)
class Target:
    """One GPU type: its planned ladder and the node label that selects it."""

    name: str
    hardware: str
    gpu_product: str
    tiers: list[TierSpec]


@dataclass(frozen=True)
class DeployPlan:
    public_model: str
    compose_target: str
    targets: dict[str, Target]

    @property
    def compose(self) -> Target:
        return self.targets[self.compose_target]


def _overlay(target: str, hardware: str, model: str, plans_dir: Path) -> dict[str, Any]:
    path = plans_dir / target / "overlay.yaml"
    if not path.exists():
        return {}
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    planned_for = doc.get("hardware")
    if planned_for is not None and str(planned_for) != hardware:
        raise ValueError(
            f"deploy/plans/{target}/overlay.yaml was planned for {planned_for}, but target "
            f"{target} runs on {hardware}: re-run `tiergate plan --hardware {hardware} --write`"
        )
    planned_model = doc.get("model")
    if planned_model is not None and str(planned_model) != model:
        raise ValueError(
            f"deploy/plans/{target}/overlay.yaml was planned for the model {planned_model}, "
            f"but deploy/plan.yaml serves {model}: re-run `tiergate plan --model {model} --write`"
        )
    return dict(doc.get("tiers") or {})


def _tier(
    raw: dict[str, Any], public_model: str, settings: Any, overlay: dict[str, Any], where: str
) -> TierSpec:
    name, precision = str(raw["name"]), str(raw["precision"])
    served = f"{public_model}-{name}"
    notes = precision_notes(precision, settings.hardware)  # type: ignore[arg-type]
    written = overlay.get(name)
    if written is not None:
        if written["precision"] != precision:
            raise ValueError(f"{where}: tier {name} is {precision}, the overlay says otherwise")
        return TierSpec(
            name,
            precision,
            served,
            [str(a) for a in written["vllm_args"]],
            bool(written["speculative"]),
            bool(written["prefix_caching"]),
            f"tiergate plan --write ({where})",
            notes,
        )
    regime = Regime(**raw["regime"])
    # The ladder fixes the tier's precision, so only its toggles are planned (q_min 0, as
    # `tiergate plan --from-gateway` does for such a tier).
    plan = plan_tier(regime, settings, [precision], None, q_min=0.0)  # type: ignore[list-item]
    return TierSpec(
        name,
        precision,
        served,
        plan.vllm_args,
        plan.speculative,
        plan.prefix_caching,
        f"planner at C={regime.concurrency:g} rho={regime.rho:g} r={regime.r:g} "
        f"on {settings.hardware.name} (deploy/plan.yaml)",
        notes,
    )


def load_plan(plan_file: Path = PLAN_FILE, plans_dir: Path = PLANS_DIR) -> DeployPlan:
    """Reads deploy/plan.yaml and plans every tier on every target."""
    doc = yaml.safe_load(plan_file.read_text(encoding="utf-8"))
    public_model = str(doc["public_model"])
    targets: dict[str, Target] = {}
    for name, raw_target in doc["targets"].items():
        settings = settings_from_mapping(
            {"hardware": raw_target["hardware"], "model": doc["model"]}
        )
        overlay = _overlay(name, str(raw_target["hardware"]), settings.model.name, plans_dir)
        ladder = [str(raw["name"]) for raw in doc["tiers"]]
        unknown = [tier for tier in overlay if tier not in ladder]
        if unknown:
            raise ValueError(
                f"deploy/plans/{name}/overlay.yaml plans tier(s) {', '.join(unknown)}, which "
                f"the ladder ({', '.join(ladder)}) does not have; `tiergate plan --regime` "
                "names its one tier 'default': rename it, or plan with --from-gateway"
            )
        tiers = [
            _tier(raw, public_model, settings, overlay, f"deploy/plans/{name}/overlay.yaml")
            for raw in doc["tiers"]
        ]
        targets[name] = Target(
            name, str(raw_target["hardware"]), str(raw_target["gpu_product"]), tiers
        )
    compose_target = str(doc["compose_target"])
    if compose_target not in targets:
        raise ValueError(f"compose_target {compose_target!r} is not one of {sorted(targets)}")
    return DeployPlan(public_model, compose_target, targets)


__all__ = ["DeployPlan", "Target", "TierSpec", "load_plan"]
