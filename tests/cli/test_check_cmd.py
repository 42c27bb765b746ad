"""`tiergate check`: the configuration as `serve` would see it, and with `--probe` the
engines as the gateway would meet them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gateway.cli.main import app
from gateway.preflight import Answer, verdict
from tests.helpers import API_KEY, ENGINE_KEY, MODEL, Ladder, free_port

runner = CliRunner()


def write(tmp_path: Path, ladder: Ladder, **tier_fields: Any) -> Path:
    data = ladder.settings().model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    for tier in data["tiers"]:
        tier.update(tier_fields)
    path = tmp_path / "tiergate.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def check(*argv: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, ["check", *argv], env=env)


def test_a_valid_configuration_passes_without_probing(keyed_ladder: Ladder, tmp_path: Path) -> None:
    path = write(tmp_path, keyed_ladder, api_key="sk-wrong")  # not probed: not found out
    result = check("--config", str(path))
    assert result.exit_code == 0, result.output
    assert "a valid configuration (2 tiers)" in result.output


def test_checking_leaves_no_label_log_behind(keyed_ladder: Ladder, tmp_path: Path) -> None:
    """A check validates the label log's path as serve would, but creates nothing."""
    data = keyed_ladder.settings().model_dump(mode="json")
    data["shadow"] = {"rate": 0.1, "label_log": str(tmp_path / "logs" / "labels.jsonl")}
    path = tmp_path / "tiergate.yaml"
    path.write_text(yaml.safe_dump(data))
    result = check("--config", str(path))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiergate.yaml"]
    (tmp_path / "logs").write_text("")  # now the log's directory cannot be made
    refused = check("--config", str(path))
    assert refused.exit_code == 2 and "logs is not a directory" in refused.output


def test_what_serve_would_refuse_is_exit_2_in_one_line(
    keyed_ladder: Ladder, tmp_path: Path
) -> None:
    path = write(tmp_path, keyed_ladder, api_key_env="UNSET_ENGINE_KEY")
    result = check("--config", str(path), env={"UNSET_ENGINE_KEY": None})  # type: ignore[dict-item]
    assert result.exit_code == 2
    assert "UNSET_ENGINE_KEY" in result.output and "Traceback" not in result.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("tiers: [")
    assert check("--config", str(broken)).exit_code == 2
    as_json = runner.invoke(app, ["check", "--config", str(broken), "--json"])
    assert as_json.exit_code == 2
    document = json.loads(as_json.stdout)
    assert document["valid"] is False and "not valid YAML" in document["error"]


def test_probe_passes_when_every_engine_answers_as_configured(
    keyed_ladder: Ladder, tmp_path: Path
) -> None:
    path = write(tmp_path, keyed_ladder, api_key=ENGINE_KEY)
    result = check("--config", str(path), "--probe", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["ok"] is True and document["probed"] is True
    assert [e["tier"] for e in document["endpoints"]] == ["nvfp4", "bf16"]
    for endpoint, sim in zip(document["endpoints"], keyed_ladder.sims, strict=True):
        assert endpoint["served"] == [sim.served_model_name] and endpoint["problems"] == []


def test_probe_names_a_missing_key_a_wrong_model_and_a_dead_endpoint(
    keyed_ladder: Ladder, tmp_path: Path
) -> None:
    data = keyed_ladder.settings().model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    data["tiers"][0]["served_model_name"] = "not-what-it-serves"
    data["tiers"][0]["api_key"] = ENGINE_KEY
    data["tiers"][1]["endpoints"].append(f"http://127.0.0.1:{free_port()}/v1")  # nothing there
    path = tmp_path / "tiergate.yaml"
    path.write_text(yaml.safe_dump(data))
    result = check("--config", str(path), "--probe", "--timeout", "2")
    assert result.exit_code == 1
    lines = result.output
    assert "not 'not-what-it-serves'" in lines and keyed_ladder.sims[0].served_model_name in lines
    assert "HTTP 401" in lines and "api_key" in lines  # the bf16 tier sends no key
    assert "cannot connect" in lines


def test_verdict_reports_each_problem_once() -> None:
    ok_models = Answer(200, b'{"data": [{"id": "m"}]}')
    assert verdict("t", "u", "m", Answer(200), ok_models).ok
    down = Answer(error="cannot connect to h:1: refused")
    assert verdict("t", "u", "m", down, down).problems == [
        "/health: cannot connect to h:1: refused"
    ]
    wrong = verdict("t", "u", MODEL, Answer(200), ok_models)
    assert wrong.served == ["m"] and "served_model_name" in wrong.problems[0]
    garbage = verdict("t", "u", "m", Answer(503), Answer(200, b"not json"))
    assert garbage.problems == [
        "/health answered HTTP 503",
        "the engine serves nothing, not 'm': set the tier's served_model_name",
    ]
