"""`tiergate up`: the embedded default, as `make run` starts it, with shadow labels on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port, free_port_block, send, stop_processes, wait_healthy

pytestmark = pytest.mark.slow


def start_up(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`tiergate up ARGV` in its own session, its output discarded."""
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "up", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_up_serves_routes_and_labels(tmp_path: Path) -> None:
    port, base = free_port(), free_port_block(3)  # the three tiers take base .. base + 2
    log = tmp_path / "labels.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "up",
            "--port",
            str(port),
            "--sim-base-port",
            str(base),
            "--sim-time-scale",
            "0.2",
            "--shadow-rate",
            "1",
            "--label-log",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        try:
            wait_healthy(f"http://127.0.0.1:{port}/ready", 60, process)  # type: ignore[arg-type]
        except RuntimeError:
            if process.poll() is not None and process.stdout is not None:
                pytest.fail(
                    f"tiergate up exited:\n{process.stdout.read().decode(errors='replace')}"
                )
            raise
        url = f"http://127.0.0.1:{port}"
        for question in (
            "hello there",
            "Prove the lemma and refactor the proof.",
            "List three rivers.",
        ):
            reply = send(
                "POST",
                f"{url}/v1/chat/completions",
                {
                    "model": "qwen3-30b-a3b",
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": 8,
                },
                key="sk-local-dev",
            )
            assert reply.status == 200 and reply.headers["x-tiergate-tier"] in {
                "nvfp4",
                "w4a16",
                "bf16",
            }
            assert 0.0 < float(reply.headers["x-tiergate-p"]) <= 1.0  # the shipped router decided

        # Every request is labelled; one served below the top tier may also explore a
        # cheaper tier, a second line with the same request id.
        def labelled() -> list[dict[str, Any]]:
            return (
                [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            )

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len({line["id"] for line in labelled()}) < 3:
            time.sleep(0.2)
        lines = labelled()
        assert len({line["id"] for line in lines}) == 3
        assert all(
            set(line["correct"]) <= {"nvfp4", "w4a16", "bf16"}
            and line["source"] == "shadow:default"
            for line in lines
        )
    finally:
        stop_processes([process])
    output = process.stdout.read().decode() if process.stdout else ""
    token = re.search(r"Admin token: (\S+)", output)
    assert (
        f"tiergate is up at http://127.0.0.1:{port}" in output
        and "sk-local-dev" in output
        and token
    )
    # Ctrl-C / SIGTERM stops the simulated tiers too.
    time.sleep(0.5)
    for offset in range(3):
        with pytest.raises(OSError):
            send("GET", f"http://127.0.0.1:{base + offset}/health", key=None, timeout=1)


def run_cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`tiergate ARGV` in a child process that must end by itself (an error, here)."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("taken", ["gateway", "sim"])
def test_up_names_the_option_when_a_port_is_taken(taken: str) -> None:
    import socket

    port, base = free_port(), free_port_block(3)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port if taken == "gateway" else base + 1))
        holder.listen()
        done = run_cli(["up", "--port", str(port), "--sim-base-port", str(base)])
    assert done.returncode == 2
    option = "--port" if taken == "gateway" else "--sim-base-port"
    assert option in done.stderr and "in use" in done.stderr


def test_up_with_a_config_keeps_its_port_and_its_privacy_choice(tmp_path: Path) -> None:
    import yaml

    port, base = free_port(), free_port_block(3)
    configured_log = tmp_path / "configured.jsonl"
    config = tmp_path / "tiergate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": "m",
                "server": {"port": port},
                "tiers": [
                    {"name": p, "precision": p, "endpoints": [f"http://127.0.0.1:{base + i}/v1"]}
                    for i, p in enumerate(("nvfp4", "w4a16", "bf16"))
                ],
                "tenants": [{"name": "t", "api_keys": ["sk-t"]}],
                "shadow": {"keep_text": False, "label_log": str(configured_log)},
                "admin": {"token": "adm"},
            }
        )
    )
    process = start_up(["--config", str(config), "--shadow-rate", "0.5"])
    try:
        wait_healthy(f"http://127.0.0.1:{port}/ready", 60, process)  # the config's port
        shadow = send("GET", f"http://127.0.0.1:{port}/admin/config", key="adm").json()["shadow"]
        # --shadow-rate turns shadow evaluation on; the file's privacy choice and log stand.
        assert shadow["rate"] == 0.5
        assert shadow["keep_text"] is False
        assert shadow["label_log"] == str(configured_log)
    finally:
        stop_processes([process])


def test_up_with_keyed_tiers_starts_simulators_that_want_the_key(tmp_path: Path) -> None:
    """A config for engines started with --api-key runs as is under `up`: each simulator
    refuses /v1 calls without its tier's key, and the gateway sends it. Without the
    variable the key is read from, `up` stops before starting anything, in one line."""
    import os

    import yaml

    port, base = free_port(), free_port_block(2)
    config = tmp_path / "tiergate.yaml"
    tiers = [
        {
            "name": p,
            "precision": p,
            "endpoints": [f"http://127.0.0.1:{base + i}/v1"],
            "api_key_env": "ENGINE_KEY",
        }
        for i, p in enumerate(("nvfp4", "bf16"))
    ]
    config.write_text(
        yaml.safe_dump(
            {
                "model": "m",
                "server": {"port": port},
                "tiers": tiers,
                "tenants": [{"name": "t", "api_keys": ["sk-t"], "thresholds": {"nvfp4": 0.0}}],
            }
        )
    )
    argv = [sys.executable, "-m", "gateway.cli.main", "up", "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_KEY"}
    refused = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "ENGINE_KEY" in refused.stderr and "Traceback" not in refused.stderr
    process = start_up(["--config", str(config)], env={**env, "ENGINE_KEY": "sk-engine"})
    try:
        wait_healthy(f"http://127.0.0.1:{port}/ready", 60, process)
        sim = f"http://127.0.0.1:{base}"
        assert send("GET", f"{sim}/v1/models", key=None).status == 401
        assert send("GET", f"{sim}/v1/models", key="sk-engine").status == 200
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        reply = send("POST", f"http://127.0.0.1:{port}/v1/chat/completions", chat, key="sk-t")
        assert reply.status == 200, reply.body
        assert reply.headers["x-tiergate-tier"] == "nvfp4"
    finally:
        stop_processes([process])


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "70000"],  # it listened on 70000 - 65536 = 4464
        ["serve", "--workers", "300"],  # above the config's own bound, 256
        ["up", "--port", "70000"],  # an OverflowError traceback
        ["up", "--sim-base-port", "65534"],  # its third tier would be on 65536
        ["sim", "--port", "65536"],
        ["sim", "--log-level", "foo"],  # uvicorn's KeyError
    ],
)
def test_out_of_range_options_are_usage_errors(argv: list[str]) -> None:
    done = run_cli(argv)
    assert done.returncode == 2, done.stderr
    assert "Invalid value for" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("planner", "simulated"), [({}, "b200"), ({"hardware": "h200"}, "h200")])
def test_local_simulators_run_on_the_gpu_the_planner_plans_for(
    planner: dict[str, str], simulated: str
) -> None:
    """The planner's knee (K from its hardware) is the engines' own: a b200 plan over h200
    simulators would recommend flags for a knee the tiers do not have."""
    from gateway.config import default_settings
    from gateway.launcher import local_sim_specs
    from gateway.planner.params import Settings as PlannerSettings

    settings = default_settings().model_copy(
        update={"planner": PlannerSettings.model_validate(planner)}
    )
    for spec in local_sim_specs(settings):
        argv = spec.argv()
        assert argv[argv.index("--hardware") + 1] == simulated
    # An explicit --hardware among the extra simulator arguments comes later, and wins.
    (first, *_) = local_sim_specs(settings, ["--hardware", "h200"])
    assert first.argv()[-2:] == ["--hardware", "h200"]


def test_up_says_it_runs_one_process_whatever_server_workers_asks(tmp_path: Path) -> None:
    """`up` keeps its demo's admin token and shadow settings in one process: a config's
    server.workers is named as being for `serve` (here before `up` stops on a missing key)."""
    import os

    import yaml

    config = tmp_path / "tiergate.yaml"
    tiers = [
        {
            "name": p,
            "precision": p,
            "endpoints": [f"http://127.0.0.1:{free_port()}/v1"],
            "api_key_env": "ENGINE_KEY",
        }
        for p in ("nvfp4", "bf16")
    ]
    config.write_text(
        yaml.safe_dump(
            {
                "model": "m",
                "server": {"port": free_port(), "workers": 2},
                "tiers": tiers,
                "tenants": [{"name": "t", "api_keys": ["sk-t"]}],
            }
        )
    )
    argv = [sys.executable, "-m", "gateway.cli.main", "up", "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_KEY"}
    done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert "server.workers (2) is for `tiergate serve`" in done.stderr
    assert done.returncode == 2


def test_up_does_not_report_the_last_runs_metric_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With $PROMETHEUS_MULTIPROC_DIR exported (as a deployment may do for every process),
    `up` starts from zero as `serve` does: the files of a run that ended are not its own."""
    from prometheus_client import CollectorRegistry, Counter, values
    from prometheus_client.values import MultiProcessValue

    metrics = tmp_path / "metrics"
    metrics.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics))
    # A finished run's counter file, written as process 999999 would have.
    monkeypatch.setattr(values, "ValueClass", MultiProcessValue(lambda: 999999))  # type: ignore[no-untyped-call]
    labels = ["tenant", "tier", "endpoint", "status"]
    stale = Counter("tiergate_requests", "", labels, registry=CollectorRegistry())
    stale.labels("default", "nvfp4", "chat", "200").inc(5)
    port, base = free_port(), free_port_block(3)
    process = start_up(["--port", str(port), "--sim-base-port", str(base)])
    try:
        wait_healthy(f"http://127.0.0.1:{port}/ready", 60, process)
        text = send("GET", f"http://127.0.0.1:{port}/metrics", key=None).body.decode()
        assert "tiergate_build_info" in text  # the merged exposition of this run
        assert "tiergate_requests_total" not in text
    finally:
        stop_processes([process])
