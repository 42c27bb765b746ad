"""deploy/prometheus: promtool accepts the scrape configuration and the rules, the rules'
unit tests pass, and every rule reads metrics that exist."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.deploy.support import (
    ALERTS,
    PROMETHEUS_SERIES,
    SCRAPE,
    VLLM_METRICS,
    gateway_metric_names,
    metric_names,
    require_binary,
)

RULE_TESTS: Final = Path(__file__).parent / "rules" / "alerts_test.yml"


def _promtool(*args: str, cwd: Path | None = None) -> str:
    result = subprocess.run(
        [require_binary("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_checks_the_scrape_config(tmp_path: Path) -> None:
    """promtool wants the gateway job's token file to exist: the compose Prometheus writes it
    at start, so the check runs on a copy that points at a local one."""
    config = yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))
    config["rule_files"] = [str(ALERTS)]
    token_file = tmp_path / "metrics_token"
    token_file.write_text("scrape-token", encoding="utf-8")
    for job in config["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token_file)
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(config), encoding="utf-8")
    out = _promtool("check", "config", str(checked))
    assert "1 rule files found" in out, out


def test_the_gateway_job_sends_the_metrics_token() -> None:
    """The gateway's /metrics (tenant names, endpoint URLs, costs) shares the published port
    with /v1: with TIERGATE_METRICS_TOKEN set it answers only the bearer token, so the
    scrape job must send it; the engines' /metrics needs none."""
    config = yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    authorization = jobs["tiergate"]["authorization"]
    assert authorization.get("type", "Bearer") == "Bearer"
    assert Path(authorization["credentials_file"]).is_absolute(), "not under /etc/prometheus"
    assert "authorization" not in jobs["vllm"]


def test_promtool_checks_the_rules() -> None:
    out = _promtool("check", "rules", str(ALERTS))
    assert f"{len(_rules())} rules found" in out, out


def test_rule_unit_tests_pass() -> None:
    _promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)


def test_the_issue_s_alerts_exist() -> None:
    names = {rule.get("alert") for rule in _rules()}
    required = {
        "TiergateTierDown",  # tier down
        "TiergateHighErrorRate",  # error rate
        "TiergateCalibrationDrift",  # calibration drift
        "TiergateFlagDrift",  # flag drift
        "TiergateNegativeSavings",  # negative savings
    }
    assert required <= names, required - names


@pytest.mark.parametrize("rule", _rules(), ids=lambda rule: rule["alert"])
def test_rule_reads_existing_metrics_and_is_documented(rule: dict[str, Any]) -> None:
    known = gateway_metric_names() | VLLM_METRICS | PROMETHEUS_SERIES
    names = metric_names(rule["expr"])
    assert names and names <= known, names - known
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_scrape_config_labels_every_engine_with_its_tier() -> None:
    config = yaml.safe_load(SCRAPE.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"tiergate", "vllm"}, "the alert rules select on these job names"
    tiers = [static["labels"]["tier"] for static in jobs["vllm"]["static_configs"]]
    assert tiers == ["nvfp4", "w4a16", "bf16"]
