"""Process plumbing for `tiergate up` and `tiergate serve`: simulated tiers as child
processes, the gateway under uvicorn, and a clean stop on Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import uvicorn

from gateway.config import Settings, tier_api_key
from gateway.server_protocol import BoundedHeadProtocol

# How `running_sims` hands a simulator its tier's key (`tiergate sim --api-key` reads it).
SIM_API_KEY_ENV: Final = "TIERGATE_SIM_API_KEY"


@dataclass(frozen=True, slots=True)
class SimSpec:
    """What one simulated tier process is started with."""

    precision: str
    port: int
    served_model_name: str
    host: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()
    hardware: str | None = None  # the cost-model preset the simulator times itself on
    # The tier's key: the simulator then refuses /v1 calls without it, as a keyed vLLM does.
    # It travels in the environment (SIM_API_KEY_ENV), never on a command line `ps` shows.
    api_key: str | None = field(default=None, repr=False)

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "sim",
            "--precision",
            self.precision,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--served-model-name",
            self.served_model_name,
            *(("--hardware", self.hardware) if self.hardware else ()),
            *self.extra_args,  # after: an explicit --hardware among them wins
        ]


def local_sim_specs(settings: Settings, extra_args: Sequence[str] = ()) -> list[SimSpec]:
    """A simulator for every http tier endpoint that points at this machine, expecting the
    tier's key if it has one (ConfigError when that key cannot be resolved). Simulators
    speak plain HTTP: an https endpoint is left to whatever serves it. They simulate the
    GPU the planner plans for (its preset), so the planner's knee is the engines' own."""
    from gateway.planner.presets import HARDWARE_PRESETS

    planned = settings.planner.hardware.name.lower()
    hardware = planned if planned in HARDWARE_PRESETS else None
    specs = []
    for tier in settings.tiers:
        api_key = tier_api_key(tier)
        for endpoint in tier.parsed_endpoints:
            if endpoint.scheme == "http" and endpoint.host in {"127.0.0.1", "localhost", "::1"}:
                specs.append(
                    SimSpec(
                        precision=tier.precision,
                        port=endpoint.port,
                        served_model_name=tier.served_model_name or settings.model,
                        host=endpoint.host,
                        extra_args=tuple(extra_args),
                        hardware=hardware,
                        api_key=api_key,
                    )
                )
    return specs


def ports_in_use(host: str, ports: Sequence[int]) -> list[int]:
    """The ports in `ports` that something already listens on (a bind fails), in order."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def wait_healthy(
    url: str, timeout_s: float = 30.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Polls `url` until it answers 200; raises RuntimeError on timeout or early exit."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy within {timeout_s:.0f}s")


PARENT_PID_ENV = "TIERGATE_PARENT_PID"


def die_with_parent() -> None:
    """In a child started by `running_sims` or `serve_workers`: exit when the parent process
    dies.

    Linux delivers SIGTERM on parent death once asked (prctl PR_SET_PDEATHSIG); checking
    the parent id afterwards closes the race where the parent died before the call.
    """
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(parent):
        raise SystemExit(0)


def freeze_startup_heap() -> None:
    """Moves what start-up allocated (libraries, the router model: ~100k objects) into the
    collector's permanent generation, so full collections under load scan request garbage
    only instead of the whole heap."""
    gc.collect()
    gc.freeze()


def exit_on_sigterm() -> None:
    """Turns SIGTERM into a clean exit so `finally` blocks (stopping children) run.

    uvicorn drains in-flight requests on SIGTERM and then re-raises the signal; with the
    default disposition that would kill the process before its children are stopped and
    report a drained, orderly shutdown as a crash.
    """

    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _raise)


@contextlib.contextmanager
def running_sims(
    specs: Sequence[SimSpec], timeout_s: float = 30.0
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Starts the simulators, waits until all are healthy, stops them on exit."""
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for spec in specs:
            env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
            env.pop(SIM_API_KEY_ENV, None)
            if spec.api_key is not None:
                env[SIM_API_KEY_ENV] = spec.api_key
            processes.append(subprocess.Popen(spec.argv(), start_new_session=True, env=env))
        for spec, process in zip(specs, processes, strict=True):
            wait_healthy(f"http://{spec.host}:{spec.port}/health", timeout_s, process)
        yield processes
    finally:
        stop_processes(processes)


def stop_processes(processes: Sequence[subprocess.Popen[bytes]], grace_s: float = 5.0) -> None:
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def gateway_server_options(log_level: str = "info") -> dict[str, Any]:
    """uvicorn settings for the gateway's hot path: httptools parser (with a bounded request
    head), uvloop, no access log."""
    return {
        "loop": "uvloop",
        "http": BoundedHeadProtocol,
        "lifespan": "on",
        "access_log": False,
        "server_header": False,
        "log_level": log_level,
        "timeout_keep_alive": 75,
        "backlog": 4096,
        "timeout_graceful_shutdown": 30,
    }


def gateway_config(app: object, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, **gateway_server_options(log_level))  # type: ignore[arg-type]


def clear_multiprocess_dir() -> str | None:
    """Empties $PROMETHEUS_MULTIPROC_DIR (created if missing) of a previous run's metric
    files, which a fresh start would otherwise report as its own; returns the directory."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        for stale in target.glob("*.db"):
            stale.unlink()
    return directory


def edit_check(copy: Path) -> Callable[[Path], None]:
    """How the supervisor judges an edit of the config file: as its workers judge the reload
    it triggers, against what they run (the last valid copy). A change they refuse, such as
    `shared_limits`, must not reach the copy a replacement worker starts from."""
    from gateway.app import check_settings
    from gateway.config import load_settings
    from gateway.routing.factory import build_policy

    def check(path: Path) -> None:
        running = load_settings(copy) if copy.exists() else None
        check_settings(load_settings(path), build_policy, running=running)

    return check


def serve_workers(config_path: Path, host: str, port: int, workers: int) -> None:
    """One gateway process per worker, each on its own SO_REUSEPORT socket; metrics merged
    across workers.

    Workers are fresh interpreters (spawned, not forked), each building its own Gateway from
    $TIERGATE_CONFIG; counters and histograms go to files in $PROMETHEUS_MULTIPROC_DIR,
    which any worker's /metrics merges.
    """
    from gateway.app import LAST_VALID_CONFIG_ENV, WORKERS_ENV
    from gateway.last_valid import LastValidConfig
    from gateway.scratch import remove_orphaned_scratch, scratch_dir
    from gateway.workers import WorkerSupervisor

    # Absolute, not resolved: a Kubernetes ConfigMap file is a symlink through `..data`,
    # which an update points at a new directory (the old one is deleted), so the resolved
    # path of today is gone after the next edit.
    source = config_path.absolute()
    os.environ["TIERGATE_CONFIG"] = str(source)
    os.environ[WORKERS_ENV] = str(workers)
    remove_orphaned_scratch()
    with contextlib.ExitStack() as scratch:
        if not clear_multiprocess_dir():
            # Ours alone: nothing reads it once the workers are gone, so it goes with us.
            metrics = scratch.enter_context(scratch_dir("metrics"))
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
        copy = scratch.enter_context(scratch_dir("config")) / "last-valid.yaml"
        kept = LastValidConfig(source, copy, edit_check(copy))
        os.environ[LAST_VALID_CONFIG_ENV] = str(kept.copy)
        # Workers end with the supervisor, even a SIGKILLed one (`die_with_parent`), instead
        # of serving on as orphans that hold the port.
        os.environ[PARENT_PID_ENV] = str(os.getpid())
        WorkerSupervisor(host, port, workers, watch=kept.refresh).run()


def banner(
    url: str,
    api_key: str,
    model: str,
    tiers: Sequence[str],
    *,
    admin_token: str | None = None,
    python: str = "python",
    has_sdk: bool = True,
) -> str:
    """What `tiergate up` prints. The examples paste as they are: the heredoc's lines start at
    the margin (an indented `EOF` never ends it) and `python` is the interpreter that has the
    OpenAI SDK (the one running tiergate, when it does)."""
    install = "" if has_sdk else f"  ({python} -m pip install openai first)\n"
    return f"""
tiergate is up at {url}  (tiers, cheapest first: {", ".join(tiers)})

  API key: {api_key}

  curl {url}/v1/chat/completions \\
    -H "Authorization: Bearer {api_key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}}' -i

  With the OpenAI SDK, streamed:
{install}
{python} - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{url}/v1", api_key="{api_key}")
for chunk in client.chat.completions.create(
        model="{model}", messages=[{{"role": "user", "content": "hi"}}], stream=True):
    print((chunk.choices[0].delta.content or "") if chunk.choices else "", end="")
print()
EOF

  The x-tiergate-tier response header names the tier that served; pin one with
  model="{model}@<tier>". Metrics: {url}/metrics.
  Admin token: {admin_token}
    curl -H "Authorization: Bearer {admin_token}" {url}/admin/plan
    (also /admin/regime, /admin/shadow, /admin/backends, /admin/config)
  Stop with Ctrl-C.
"""


__all__ = [
    "SIM_API_KEY_ENV",
    "SimSpec",
    "banner",
    "clear_multiprocess_dir",
    "die_with_parent",
    "exit_on_sigterm",
    "freeze_startup_heap",
    "gateway_config",
    "gateway_server_options",
    "local_sim_specs",
    "ports_in_use",
    "running_sims",
    "serve_workers",
    "stop_processes",
    "wait_healthy",
]
