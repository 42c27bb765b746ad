"""deploy/compose: both files pass `docker-compose config` (no engine needed) and wire the
ladder, the gateway, Prometheus and Grafana together; no secret is committed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gateway.config import load_settings
from tests.deploy.support import DEPLOY, SCRAPE, require_binary

COMPOSE: Final = DEPLOY / "compose"
GPU: Final = COMPOSE / "docker-compose.gpu.yml"
CPU: Final = COMPOSE / "docker-compose.cpu.yml"
SECRETS: Final = {"TIERGATE_KEYS_DEFAULT": "sk-placeholder", "GRAFANA_ADMIN_PASSWORD": "pw"}
TIERS: Final = ("tier-nvfp4", "tier-w4a16", "tier-bf16")


def _config(path: Path, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "empty.env"  # a developer's deploy/compose/.env must not leak in
    empty.write_text("", encoding="utf-8")
    return subprocess.run(
        [require_binary("docker-compose"), "--env-file", str(empty), "-f", str(path), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
    )


def _resolved(path: Path, env: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    result = _config(path, env, tmp_path)
    assert result.returncode == 0, result.stderr
    return dict(yaml.safe_load(result.stdout))


def _monitoring_is_mounted(services: dict[str, Any]) -> None:
    prometheus = " ".join(str(v) for v in services["prometheus"]["volumes"])
    assert str(DEPLOY / "prometheus") in prometheus
    grafana = " ".join(str(v) for v in services["grafana"]["volumes"])
    assert str(DEPLOY / "grafana" / "provisioning") in grafana
    assert str(DEPLOY / "grafana" / "dashboards") in grafana


def test_gpu_file_is_valid_and_reserves_a_gpu_per_tier(tmp_path: Path) -> None:
    services = _resolved(GPU, SECRETS, tmp_path)["services"]
    assert set(services) == {*TIERS, "gateway", "prometheus", "grafana"}
    gpus = set()
    for name in TIERS:
        service = services[name]
        assert service["image"].startswith("vllm/vllm-openai:")
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
        gpus.update(device["device_ids"])
    assert gpus == {"0", "1", "2"}, "one GPU per tier by default"
    _monitoring_is_mounted(services)


def test_gpu_file_needs_its_secrets(tmp_path: Path) -> None:
    for missing in SECRETS:
        env = {k: v for k, v in SECRETS.items() if k != missing}
        result = _config(GPU, env, tmp_path)
        assert result.returncode != 0 and missing in result.stderr, result.stderr


def test_cpu_file_is_valid_and_simulates_the_same_ladder(tmp_path: Path) -> None:
    cpu = _resolved(CPU, {}, tmp_path)["services"]
    gpu = _resolved(GPU, SECRETS, tmp_path)["services"]
    assert set(cpu) == set(gpu)
    for name in TIERS:
        command = cpu[name]["command"]
        assert command[0] == "sim"
        gpu_args = gpu[name]["command"]
        # The simulated tier runs the toggles the planner chose for the real one.
        assert ("--prefix-caching" in command) == ("--enable-prefix-caching" in gpu_args)
        assert ("--spec-decode" in command) == ("--speculative-config" in gpu_args)
        served = gpu_args[gpu_args.index("--served-model-name") + 1]
        assert command[command.index("--served-model-name") + 1] == served
    assert cpu["gateway"]["environment"]["TIERGATE_KEYS_DEFAULT"] == "sk-local-dev"
    _monitoring_is_mounted(cpu)


@pytest.mark.parametrize("key", [None, "sk-engine"])
def test_engines_and_gateway_read_one_engine_key(tmp_path: Path, key: str | None) -> None:
    """TIERGATE_ENGINE_KEY is each engine's key (vLLM's VLLM_API_KEY, the simulator's
    variable) and the gateway's tier key, in both files; unset, it is empty everywhere,
    which means no key on either side."""
    env = {} if key is None else {"TIERGATE_ENGINE_KEY": key}
    settings = load_settings(COMPOSE / "tiergate.yaml")
    assert {tier.api_key_env for tier in settings.tiers} == {"TIERGATE_ENGINE_KEY"}
    gpu = _resolved(GPU, {**SECRETS, **env}, tmp_path)["services"]
    cpu = _resolved(CPU, env, tmp_path)["services"]
    expected = key or ""
    for services, variable in ((gpu, "VLLM_API_KEY"), (cpu, "TIERGATE_SIM_API_KEY")):
        assert services["gateway"]["environment"]["TIERGATE_ENGINE_KEY"] == expected
        for name in TIERS:
            assert services[name]["environment"][variable] == expected, name


def test_gateway_config_is_valid_and_keyless() -> None:
    settings = load_settings(COMPOSE / "tiergate.yaml")
    assert [t.name for t in settings.tiers] == ["nvfp4", "w4a16", "bf16"]
    for tenant in settings.tenants:
        assert not tenant.api_keys and tenant.api_keys_env, tenant.name
    assert [t.endpoints for t in settings.tiers] == [[f"http://{name}:8000/v1"] for name in TIERS]
    # The live planner costs flags on the GPU the ladder was planned for (deploy/plan.yaml).
    assert settings.planner.hardware.name.lower() == "h200"


def test_no_key_is_committed() -> None:
    """Only the CPU profile's dev key, and the line of the renderer that writes it."""
    allowed = {CPU: {"sk-local-dev"}, DEPLOY / "rendering" / "compose.py": {"sk-local-dev"}}
    found = {}
    for path in DEPLOY.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            text = path.read_text(encoding="utf-8", errors="replace")
            keys = set(re.findall(r"\bsk-[A-Za-z0-9_-]{4,}", text)) - allowed.get(path, set())
            if keys:
                found[str(path)] = keys
    assert not found, found


def test_the_image_builds_its_wheels_with_the_compile_arg_set(tmp_path: Path) -> None:
    """Docker puts the build arg TIERGATE_COMPILE=1 into every RUN's environment. The
    dependency step builds tiergate in pip's isolated environment, which has no mypy, so it
    must clear the arg; run here exactly as the Dockerfile writes it (without the deps)."""
    import os
    import shlex
    import sys

    dockerfile = (DEPLOY / "compose" / "Dockerfile").read_text()
    step = re.search(r"^RUN (TIERGATE_COMPILE=\S+ )?pip wheel [^\\\n]*", dockerfile, re.M)
    assert step is not None, "the dependency wheel step is missing"
    argv = shlex.split(step.group(0).removeprefix("RUN "))
    env = {**os.environ, "TIERGATE_COMPILE": "1"}
    while "=" in argv[0]:
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    assert argv[:2] == ["pip", "wheel"] and argv[-1] == ".[redis]"  # redis: shared limits
    wheels = tmp_path / "wheels"
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheels), "."]
    done = subprocess.run(
        argv, cwd=DEPLOY.parent, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert [p.name.split("-")[0] for p in wheels.iterdir()] == ["tiergate"]


@pytest.mark.parametrize("path", [GPU, CPU], ids=["gpu", "cpu"])
@pytest.mark.parametrize("token", [None, "scrape-token"])
def test_prometheus_sends_the_gateway_s_metrics_token(
    tmp_path: Path, path: Path, token: str | None
) -> None:
    """/metrics shares the published port with /v1: the gateway reads
    TIERGATE_METRICS_TOKEN, and Prometheus's entrypoint writes the same variable to the file
    its gateway job sends as a bearer token (on a tmpfs); unset, both are empty (open)."""
    env = {**SECRETS, **({} if token is None else {"TIERGATE_METRICS_TOKEN": token})}
    services = _resolved(path, env, tmp_path)["services"]
    assert services["gateway"]["environment"]["TIERGATE_METRICS_TOKEN"] == (token or "")
    prometheus = services["prometheus"]
    assert prometheus["environment"]["TIERGATE_METRICS_TOKEN"] == (token or "")
    jobs = {job["job_name"]: job for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]}
    authorization = jobs["tiergate"]["authorization"]
    token_file = authorization["credentials_file"]
    assert authorization.get("type", "Bearer") == "Bearer"
    assert str(Path(token_file).parent) in prometheus["tmpfs"]
    # Run the entrypoint as the container would (compose's `$$` is `$`), with the token
    # file moved here and `echo` standing in for Prometheus.
    here = tmp_path / "metrics_token"
    script = prometheus["entrypoint"][2].replace("$$", "$").replace(token_file, str(here))
    assert "exec /bin/prometheus " in script
    argv = [*prometheus["entrypoint"][:2], script.replace("/bin/prometheus", "echo")]
    argv += [*prometheus["entrypoint"][3:], *prometheus["command"]]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
        env={"PATH": "/usr/bin:/bin", **prometheus["environment"]},
    )
    assert done.stdout.split() == prometheus["command"]
    assert here.read_text() == (token or "")
