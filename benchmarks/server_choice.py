"""Which ASGI server the gateway runs on: uvicorn (httptools, uvloop) against granian (Rust).

The HTTP server sits on the hot path like the upstream client does, so the choice is measured
rather than assumed. Four targets front the fixed fast fake backend: tiergate and the lean
pass-through, each under uvicorn exactly as shipped (`tiergate serve`, `lean_proxy.py`) and
under granian (one worker, one runtime thread, uvloop, HTTP/1.1, ASGI; the same app objects,
built by the factories below). Rounds interleave the targets so that the host's drifting
speed reaches all of them alike; each point is wrk at concurrency 8 with the JSON request of
`overhead.py`, CPU per request from /proc (the server process and its children).

granian is installed on first use into its own directory (.venv-bench-granian, `pip
--target`), so it never enters the gateway's environment.
Run: python benchmarks/server_choice.py [--rounds 3] [--duration 4]
Writes benchmarks/results/server_choice.{json,md}. A reported figure, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
GRANIAN_DIR = REPO / ".venv-bench-granian"
GRANIAN_REQUIREMENT = "granian>=2.8,<3"
sys.path.insert(0, str(BENCH))
from overhead import (  # noqa: E402
    CHAT,
    PYTHON,
    RESULTS,
    Target,
    cpu_seconds,
    free_port,
    gateway_config,
    write_results,
    wrk,
)


# -- factories granian imports (`server_choice:tiergate_app`), configured by environment ----
def tiergate_app() -> Any:
    from gateway.app import build_app
    from gateway.config import load_settings
    from gateway.routing.factory import build_policy

    config = Path(os.environ["SERVER_CHOICE_CONFIG"])
    return build_app(load_settings(config), policy_factory=build_policy, config_path=config)


def lean_app() -> Any:
    from lean_proxy import make_app

    from gateway.backends.h1client import ConnectionPool

    return make_app(ConnectionPool("127.0.0.1", int(os.environ["SERVER_CHOICE_BACKEND"])))


# -- the measurement ------------------------------------------------------------------------
def ensure_granian() -> Path:
    binary = GRANIAN_DIR / "bin" / "granian"
    if not binary.exists():
        print(f"installing {GRANIAN_REQUIREMENT} into {GRANIAN_DIR.name} ...", flush=True)
        install = [PYTHON, "-m", "pip", "install", "-q", "--target", str(GRANIAN_DIR)]
        subprocess.run([*install, GRANIAN_REQUIREMENT], check=True)
    return binary


def granian_version() -> str:
    found = sorted(GRANIAN_DIR.glob("granian-*.dist-info"))
    return found[-1].name.removeprefix("granian-").removesuffix(".dist-info") if found else "?"


def make_targets(workdir: Path, backend_port: int, granian: Path) -> list[Target]:
    config = gateway_config(workdir / "tiergate.yaml", backend_port)
    env = {
        "PYTHONPATH": os.pathsep.join([str(GRANIAN_DIR), str(BENCH), str(REPO)]),
        "SERVER_CHOICE_CONFIG": str(config),
        "SERVER_CHOICE_BACKEND": str(backend_port),
    }
    granian_args = [PYTHON, str(granian), "--interface", "asgi", "--factory"]
    granian_args += ["--host", "127.0.0.1", "--workers", "1", "--runtime-threads", "1"]
    granian_args += ["--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning"]
    ports = [free_port() for _ in range(4)]
    serve = [PYTHON, "-m", "gateway.cli.main", "serve", "--config", str(config), "--port"]

    def under_granian(name: str, factory: str, port: int) -> Target:
        argv = [*granian_args, "--port", str(port), f"server_choice:{factory}"]
        return Target(name, argv, port, "/health", env=env, cwd=workdir)

    return [
        Target("tiergate, uvicorn", [*serve, str(ports[0])], ports[0], "/health", cwd=workdir),
        under_granian("tiergate, granian", "tiergate_app", ports[1]),
        Target(
            "lean, uvicorn",
            [PYTHON, str(BENCH / "lean_proxy.py"), str(ports[2]), str(backend_port)],
            ports[2],
            "/health",
        ),
        under_granian("lean, granian", "lean_app", ports[3]),
    ]


def measure(rounds: int, duration_s: float) -> dict[str, Any]:
    granian = ensure_granian()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        backend_port = free_port()
        backend = Target(
            "backend",
            [PYTHON, str(BENCH / "fake_backend.py"), str(backend_port)],
            backend_port,
            "/health",
        )
        backend.start()
        servers = make_targets(workdir, backend_port, granian)
        points: dict[str, list[dict[str, float]]] = {t.name: [] for t in servers}
        try:
            for target in servers:
                target.start()
                wrk(target.url, CHAT, 8, 2, workdir)  # warm-up
            for _ in range(rounds):
                for target in servers:
                    before = cpu_seconds(target.pid)
                    run = wrk(target.url, CHAT, 8, duration_s, workdir)
                    used = cpu_seconds(target.pid) - before
                    if run["errors"]:
                        raise RuntimeError(f"{target.name}: {run['errors']} failed requests")
                    run["cpu_ms_per_request"] = used / run["requests"] * 1e3
                    points[target.name].append(run)
                    print(
                        f"{target.name:18s} {run['rps']:8.0f} req/s  "
                        f"{run['cpu_ms_per_request']:.3f} ms CPU per request",
                        flush=True,
                    )
        finally:
            for target in servers:
                target.stop()
            backend.stop()
    return {
        "points": points,
        "median": {
            name: {
                key: statistics.median(run[key] for run in runs)
                for key in ("rps", "cpu_ms_per_request", "p50_ms")
            }
            for name, runs in points.items()
        },
        "granian": granian_version(),
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Measured {results['date']} on {results['machine']}: wrk -t1 -c8, "
        f"{results['duration_s']} s per point, {results['rounds']} interleaved rounds, medians. "
        f"granian {results['granian']} (one worker, one runtime thread, uvloop, HTTP/1.1).",
        "",
        "| target | req/s | CPU ms per JSON request | all rounds' CPU ms |",
        "|---|---|---|---|",
    ]
    for name, median in results["median"].items():
        cpu = ", ".join(f"{run['cpu_ms_per_request']:.3f}" for run in results["points"][name])
        lines.append(
            f"| {name} | {median['rps']:,.0f} | {median['cpu_ms_per_request']:.3f} | {cpu} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is required (tests/tools/install_system_deps.sh installs it)")
    results = measure(args.rounds, args.duration)
    results |= {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
        f"Python {platform.python_version()}",
        "rounds": args.rounds,
        "duration_s": args.duration,
    }
    write_results(args.out, "server_choice", results, markdown(results))


if __name__ == "__main__":
    main()
