"""The checked-in deploy files are exactly what the renderer makes from the planner today.

If the planner's flags, the presets' checkpoints or a dashboard definition change, these
tests fail until `python -m deploy.render` is run and the result committed. The vLLM
arguments are also recomputed here, from deploy/plan.yaml straight through `plan_tier`, and
compared with every file that carries them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from typer.testing import CliRunner

from deploy.render import render_all, stale_files
from deploy.rendering.plan import load_plan
from gateway.cli.main import app as cli
from gateway.config import load_settings, parse_settings
from gateway.planner.params import settings_from_mapping
from gateway.planner.planner import Regime, plan_tier
from tests.deploy.support import DEPLOY, REPO

PLAN: Final = yaml.safe_load((DEPLOY / "plan.yaml").read_text(encoding="utf-8"))


def test_checked_in_files_equal_a_fresh_rendering() -> None:
    stale = stale_files(render_all())
    assert not stale, (
        f"stale: {[str(p.relative_to(REPO)) for p in stale]}; "
        "run `python -m deploy.render` and commit the result"
    )


def test_render_check_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "deploy.render", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _planned(target: str) -> dict[str, list[str]]:
    """Each tier's argv, computed here without the renderer."""
    settings = settings_from_mapping(
        {"hardware": PLAN["targets"][target]["hardware"], "model": PLAN["model"]}
    )
    return {
        tier["name"]: plan_tier(
            Regime(**tier["regime"]), settings, [tier["precision"]], None, q_min=0.0
        ).vllm_args
        for tier in PLAN["tiers"]
    }


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


@pytest.mark.parametrize("target", list(PLAN["targets"]))
def test_k8s_engines_run_the_planner_s_arguments(target: str) -> None:
    planned = _planned(target)
    docs = _docs(DEPLOY / "k8s" / "rendered" / f"{target}.yaml")
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    (config,) = [d for d in docs if d["metadata"]["name"] == "tiergate-config"]
    settings = parse_settings(yaml.safe_load(config["data"]["tiergate.yaml"]))
    for tier in settings.tiers:
        args = deployments[f"tier-{tier.name}"]["spec"]["template"]["spec"]["containers"][0]
        assert args["args"][: len(planned[tier.name])] == planned[tier.name]
        assert tier.vllm_args == planned[tier.name]


def test_compose_engines_run_the_planner_s_arguments() -> None:
    planned = _planned(PLAN["compose_target"])
    services = yaml.safe_load((DEPLOY / "compose" / "docker-compose.gpu.yml").read_text())[
        "services"
    ]
    settings = load_settings(DEPLOY / "compose" / "tiergate.yaml")
    for tier in settings.tiers:
        command = services[f"tier-{tier.name}"]["command"]
        assert command[: len(planned[tier.name])] == planned[tier.name]
        assert tier.vllm_args == planned[tier.name]


def test_a_plan_written_by_the_cli_is_taken_verbatim(tmp_path: Path) -> None:
    """`tiergate plan --write DIR` output, dropped in deploy/plans/<target>, wins."""
    out = tmp_path / "plans" / "h200"
    result = CliRunner().invoke(
        cli,
        ["plan", "--regime", "C=8,rho=0.9,r=0.9", "--hardware", "h200", "--candidates",
         "nvfp4", "--q-min", "0", "--write", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((out / "overlay.yaml").read_text(encoding="utf-8"))
    # --regime plans one tier called "default"; --from-gateway names them after the tiers.
    written["tiers"] = {"nvfp4": written["tiers"]["default"]}
    (out / "overlay.yaml").write_text(yaml.safe_dump(written), encoding="utf-8")
    plan = load_plan(plans_dir=tmp_path / "plans")
    nvfp4 = plan.targets["h200"].tiers[0]
    assert nvfp4.vllm_args == written["tiers"]["nvfp4"]["vllm_args"]
    assert "tiergate plan --write" in nvfp4.source
    assert plan.targets["b200"].tiers[0].source.startswith("planner at")


def test_a_plan_written_for_another_gpu_is_refused(tmp_path: Path) -> None:
    # The CLI's default hardware is b200; dropped into the h200 target, it would be wrong.
    out = tmp_path / "plans" / "h200"
    result = CliRunner().invoke(cli, ["plan", "--regime", "C=8,rho=0.9,r=0.9", "--write", str(out)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((out / "overlay.yaml").read_text(encoding="utf-8"))["hardware"] == "b200"
    with pytest.raises(ValueError, match=r"planned for b200.*--hardware h200"):
        load_plan(plans_dir=tmp_path / "plans")


def test_a_plan_written_for_another_model_is_refused(tmp_path: Path) -> None:
    """The right GPU but another checkpoint: its arguments would serve the wrong model."""
    out = tmp_path / "plans" / "h200"
    argv = ["plan", "--regime", "C=8,rho=0.9,r=0.9", "--hardware", "h200",
            "--model", "qwen3-coder-30b-a3b", "--candidates", "bf16", "--write", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((out / "overlay.yaml").read_text(encoding="utf-8"))
    written["tiers"] = {"bf16": written["tiers"]["default"]}
    (out / "overlay.yaml").write_text(yaml.safe_dump(written), encoding="utf-8")
    with pytest.raises(ValueError, match=r"planned for the model qwen3-coder-30b-a3b"):
        load_plan(plans_dir=tmp_path / "plans")


def test_an_overlay_for_a_tier_the_ladder_lacks_is_refused(tmp_path: Path) -> None:
    # `plan --regime --write` names its one tier "default": dropped in as is, it would be
    # ignored without a word.
    out = tmp_path / "plans" / "h200"
    result = CliRunner().invoke(
        cli, ["plan", "--regime", "C=8,rho=0.9,r=0.9", "--hardware", "h200", "--write", str(out)]
    )
    assert result.exit_code == 0, result.output
    with pytest.raises(ValueError, match=r"plans tier\(s\) default, which the ladder"):
        load_plan(plans_dir=tmp_path / "plans")


def test_render_reports_a_bad_plan_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deploy import render

    def broken() -> dict[Path, str]:
        raise ValueError("deploy/plans/h200/overlay.yaml was planned for b200")

    monkeypatch.setattr(render, "render_all", broken)
    assert render.main(["--check"]) == 2
    assert capsys.readouterr().err == (
        "deploy.render: error: deploy/plans/h200/overlay.yaml was planned for b200\n"
    )
