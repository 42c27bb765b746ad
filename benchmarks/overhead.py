"""Gateway overhead, measured in ONE run against direct, a lean pass-through and LiteLLM.

Every target fronts the same fixed fast fake backend (benchmarks/fake_backend.py):
  direct    wrk -> backend
  lean      wrk -> benchmarks/lean_proxy.py (same server stack and upstream client as
            tiergate, nothing else) -> backend
  tiergate  wrk -> `tiergate serve` (auth, validation, routing, metrics, observer sampling
            on; one tenant) -> backend
  tiergate-mypyc  the same with the router's hot path compiled (--compiled DIR, a
            `TIERGATE_COMPILE=1 pip install --target DIR .`; `make compiled` builds one)
  litellm   wrk -> LiteLLM proxy (own venv .venv-bench-litellm, extra `bench`) -> backend

For concurrency 1, 8 and 64: requests/s and latency percentiles from wrk (JSON requests);
added p50/p99 = target minus direct at the same concurrency; process CPU per request from
/proc (the target and its children); streaming (16-chunk SSE): CPU per stream with wrk, for
events written back to back and for events 1 ms apart (one per read), and time-to-first-event
added, with a sequential Python client; RSS after the runs and across
two consecutive long runs for tiergate. Writes benchmarks/results/overhead.{json,md,png}.

Figures are ratios measured in the same run on the same machine; nothing here is a test.
Run: python benchmarks/overhead.py [--duration 5] [--no-litellm] [--long-requests 50000]
           [--compiled build/compiled-router]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PYTHON = sys.executable
LITELLM_VENV = REPO / ".venv-bench-litellm"
KEY = "sk-bench"
COMPILED = "tiergate-mypyc"  # the target running the compiled router build (--compiled DIR)
CHAT = {
    "model": "bench",
    "messages": [
        {"role": "user", "content": "hello, how are you today? write me a python function"}
    ],
    "max_tokens": 16,
}
STREAM = {**CHAT, "stream": True}
# The fake backend spaces this stream's events 1 ms apart, as a decoding engine does: each
# event reaches the proxy in its own read (the back-to-back stream arrives in one or two).
PACED_STREAM = {**STREAM, "user": "paced"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def fake_backend() -> Iterator[int]:
    """The fixed fast fake backend in a child process, for the in-process benchmarks; yields
    its port once it answers."""
    port = free_port()
    backend = subprocess.Popen([PYTHON, str(REPO / "benchmarks" / "fake_backend.py"), str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 30, backend)
        yield port
    finally:
        backend.terminate()
        backend.wait(10)


def wait_http(url: str, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {process.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status < 500:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not up after {timeout_s}s")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and all its descendants, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                stats[int(entry.name)] = fields
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        fields = stats.get(current)
        if fields:
            total += (int(fields[11]) + int(fields[12])) / tick
        stack.extend(children.get(current, []))
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Target:
    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        health: str,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name, self.argv, self.port, self.health = name, argv, port, health
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> None:
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_http(self.url + self.health, timeout_s, self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    match = re.match(r"([\d.]+)(us|ms|s)", text)
    assert match, text
    return float(match.group(1)) * _UNITS[match.group(2)]


def wrk(
    url: str, body: dict[str, Any], concurrency: int, duration_s: float, workdir: Path
) -> dict[str, float]:
    script = workdir / "post.lua"
    script.write_text(
        "wrk.method = 'POST'\n"
        f"wrk.body = [[{json.dumps(body)}]]\n"
        "wrk.headers['Content-Type'] = 'application/json'\n"
        f"wrk.headers['Authorization'] = 'Bearer {KEY}'\n"
    )
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{max(1, round(duration_s))}s",
            "--latency",
            "-s",
            str(script),
            url + "/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_wrk(out, url)


def parse_wrk(out: str, url: str) -> dict[str, float]:
    """wrk's figures; a run with error answers fails, since wrk counts them as requests (a
    target answering 401 or 502 fast would read as fast)."""
    percentiles = dict(re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", out, re.M))
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} of {requests} answers were not 2xx or 3xx")
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "requests": requests,
        "p50_ms": _ms(percentiles["50"]),
        "p99_ms": _ms(percentiles["99"]),
        "errors": 0,
    }


async def _ttft_once(port: int, payload: bytes) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {KEY}\r\ncontent-length: {len(payload)}\r\n".encode()
        + b"connection: close\r\n\r\n"
        + payload
    )
    started = time.perf_counter()
    writer.write(request)
    seen = b""
    while b"data:" not in seen:
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError("stream ended before its first event")
        seen += chunk
    first = time.perf_counter() - started
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return first


def ttft_ms(port: int, samples: int = 200) -> float:
    payload = json.dumps(STREAM).encode()

    async def run() -> list[float]:
        return [await _ttft_once(port, payload) for _ in range(samples)]

    return statistics.median(asyncio.run(run())) * 1000


def gateway_config(path: Path, backend_port: int) -> Path:
    tiers = "\n".join(
        f"  - {{name: {name}, precision: {name}, "
        f"endpoints: ['http://127.0.0.1:{backend_port}/v1'], served_model_name: bench-model}}"
        for name in ("nvfp4", "w4a16", "bf16")
    )
    path.write_text(
        f"model: bench\ntiers:\n{tiers}\ntenants:\n  - {{name: bench, api_keys: ['{KEY}']}}\n"
    )
    return path


def litellm_config(path: Path, backend_port: int) -> Path:
    path.write_text(
        "model_list:\n"
        "  - model_name: bench\n"
        "    litellm_params:\n"
        "      model: openai/bench-model\n"
        f"      api_base: http://127.0.0.1:{backend_port}/v1\n"
        "      api_key: sk-upstream\n"
        "general_settings:\n"
        f"  master_key: {KEY}\n"
    )
    return path


def ensure_litellm() -> Path | None:
    binary = LITELLM_VENV / "bin" / "litellm"
    if binary.exists():
        return binary
    print(
        "installing LiteLLM into .venv-bench-litellm (its own venv: its pins conflict) ...",
        flush=True,
    )
    subprocess.run([PYTHON, "-m", "venv", str(LITELLM_VENV)], check=True)
    result = subprocess.run(
        [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"], check=False
    )
    return binary if result.returncode == 0 and binary.exists() else None


@contextlib.contextmanager
def targets(
    workdir: Path, with_litellm: bool, compiled: Path | None = None
) -> Iterator[dict[str, Target]]:
    backend_port = free_port()
    backend = Target(
        "direct",
        [PYTHON, str(REPO / "benchmarks" / "fake_backend.py"), str(backend_port)],
        backend_port,
        "/health",
    )
    made = {"direct": backend}
    lean_port = free_port()
    made["lean"] = Target(
        "lean",
        [PYTHON, str(REPO / "benchmarks" / "lean_proxy.py"), str(lean_port), str(backend_port)],
        lean_port,
        "/health",
    )
    config = gateway_config(workdir / "tiergate.yaml", backend_port)
    builds = {"tiergate": None} if compiled is None else {"tiergate": None, COMPILED: compiled}
    for name, site in builds.items():
        port = free_port()
        serve = ["serve", "--config", str(config), "--port", str(port)]
        made[name] = Target(
            name,
            [PYTHON, "-m", "gateway.cli.main", *serve],
            port,
            "/health",
            # Started outside the repository, so the compiled copy first on PYTHONPATH is
            # what imports (not the source in the working directory).
            env=None if site is None else {"PYTHONPATH": str(site.resolve())},
            cwd=workdir,
        )
    if with_litellm:
        binary = ensure_litellm()
        if binary is not None:
            port = free_port()
            made["litellm"] = Target(
                "litellm",
                [
                    str(binary),
                    "--config",
                    str(litellm_config(workdir / "litellm.yaml", backend_port)),
                    "--port",
                    str(port),
                    "--host",
                    "127.0.0.1",
                    "--num_workers",
                    "1",
                ],
                port,
                "/health/liveliness",
                env={
                    "LITELLM_LOG": "ERROR",
                    "LITELLM_TELEMETRY": "False",
                    "DISABLE_ADMIN_UI": "True",
                },
            )
    try:
        for target in made.values():
            target.start(timeout_s=180 if target.name == "litellm" else 60)
        for name, site in builds.items():
            expected = "python" if site is None else "mypyc"
            with urllib.request.urlopen(made[name].url + "/metrics", timeout=10) as response:
                metrics = response.read().decode()
            if f'router_build="{expected}"' not in metrics:
                raise SystemExit(f"{name} does not run the {expected} router build")
        yield made
    finally:
        for target in made.values():
            target.stop()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    results: dict[str, Any] = {"targets": {}, "concurrency": concurrencies}
    with (
        tempfile.TemporaryDirectory() as tmp,
        targets(Path(tmp), not args.no_litellm, args.compiled) as running,
    ):
        workdir = Path(tmp)
        # Warm every target up (connection pools, imports, JIT-less caches).
        for target in running.values():
            wrk(target.url, CHAT, 8, 2, workdir)
        for name, target in running.items():
            entry: dict[str, Any] = {"json": {}}
            for c in concurrencies:
                before = cpu_seconds(target.pid)
                run = wrk(target.url, CHAT, c, args.duration, workdir)
                run["cpu_ms_per_request"] = (
                    1000 * (cpu_seconds(target.pid) - before) / max(1, run["requests"])
                )
                entry["json"][str(c)] = run
                print(
                    f"{name:9s} c={c:<3d} {run['rps']:9.0f} req/s  p50 {run['p50_ms']:7.3f} ms  "
                    f"p99 {run['p99_ms']:7.3f} ms  cpu {run['cpu_ms_per_request']:.3f} ms/req",
                    flush=True,
                )
            before = cpu_seconds(target.pid)
            stream = wrk(target.url, STREAM, 8, args.duration, workdir)
            stream["cpu_ms_per_request"] = (
                1000 * (cpu_seconds(target.pid) - before) / max(1, stream["requests"])
            )
            entry["stream"] = stream
            before = cpu_seconds(target.pid)
            paced = wrk(target.url, PACED_STREAM, 8, args.duration, workdir)
            paced["cpu_ms_per_request"] = (
                1000 * (cpu_seconds(target.pid) - before) / max(1, paced["requests"])
            )
            entry["stream_paced"] = paced
            entry["ttft_ms"] = ttft_ms(target.port)
            entry["rss_mb"] = rss_mb(target.pid)
            print(
                f"{name:9s} stream c=8 cpu {stream['cpu_ms_per_request']:.3f} ms/stream "
                f"(paced {paced['cpu_ms_per_request']:.3f})  "
                f"ttft p50 {entry['ttft_ms']:.3f} ms  rss {entry['rss_mb']:.0f} MB",
                flush=True,
            )
            results["targets"][name] = entry
        if args.long_requests:
            gw = running["tiergate"]
            rps = results["targets"]["tiergate"]["json"][str(concurrencies[-1])]["rps"]
            seconds = max(5.0, args.long_requests / max(rps, 1.0))
            rss = []
            for _ in range(2):
                run = wrk(gw.url, CHAT, concurrencies[-1], seconds, workdir)
                rss.append({"requests": run["requests"], "rss_mb": rss_mb(gw.pid)})
            results["tiergate_long_runs"] = rss
            print(f"tiergate long runs: {rss}", flush=True)
    return results


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    t, cs = results["targets"], [str(c) for c in results["concurrency"]]
    direct = t["direct"]

    def added(name: str, c: str, key: str) -> float:
        return float(t[name]["json"][c][key] - direct["json"][c][key])

    summary: dict[str, Any] = {"added": {}, "max_rps": {}, "ttft_added_ms": {}}
    for name in t:
        if name == "direct":
            continue
        summary["added"][name] = {
            c: {"p50_ms": added(name, c, "p50_ms"), "p99_ms": added(name, c, "p99_ms")} for c in cs
        }
        summary["ttft_added_ms"][name] = t[name]["ttft_ms"] - direct["ttft_ms"]
    for name in t:
        summary["max_rps"][name] = max(t[name]["json"][c]["rps"] for c in cs)
    checks: dict[str, float] = {}
    for name in ("tiergate", COMPILED):
        if name not in t:
            continue
        gw = t[name]
        checks |= {
            f"{name}: vs_lean_rps >= 0.75": summary["max_rps"][name] / summary["max_rps"]["lean"],
            f"{name}: cpu_ms_per_json_request <= 0.35": statistics.median(
                gw["json"][c]["cpu_ms_per_request"] for c in cs
            ),
            f"{name}: cpu_ms_per_16_chunk_stream <= 0.5": gw["stream"]["cpu_ms_per_request"],
            f"{name}: added_p50_ms_at_c1 <= 0.6": summary["added"][name][cs[0]]["p50_ms"],
        }
        if "litellm" in t:
            checks[f"{name}: vs_litellm_rps >= 30"] = (
                summary["max_rps"][name] / summary["max_rps"]["litellm"]
            )
    if "tiergate_long_runs" in results:
        runs = results["tiergate_long_runs"]
        checks["tiergate: rss_mb_after_long_runs <= 150"] = runs[-1]["rss_mb"]
        checks["tiergate: rss_growth_mb_between_runs ~ 0"] = runs[-1]["rss_mb"] - runs[0]["rss_mb"]
    summary["checks"] = checks
    return summary


def _passes(name: str, value: float) -> str:
    if "<=" in name:
        return "yes" if value <= float(name.split("<=")[1]) else "NO"
    if ">=" in name:
        return "yes" if value >= float(name.split(">=")[1]) else "NO"
    return "yes" if abs(value) < 5 else "NO"


def markdown(results: dict[str, Any], summary: dict[str, Any]) -> str:
    t, cs = results["targets"], [str(c) for c in results["concurrency"]]
    lines = [
        f"Measured {results['date']} on {results['machine']} "
        f"(one run; wrk -t1, {results['duration_s']} s per point).",
        "",
        "| target | added p50 ms at c="
        + " / ".join(cs)
        + " | added p99 ms at c="
        + " / ".join(cs)
        + " | max req/s | CPU ms per JSON request (c="
        + "/".join(cs)
        + ") | CPU ms per 16-chunk stream: back to back / paced | TTFT added ms | RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in t.items():
        if name == "direct":
            p50 = " / ".join(f"({entry['json'][c]['p50_ms']:.2f})" for c in cs)
            p99 = " / ".join(f"({entry['json'][c]['p99_ms']:.2f})" for c in cs)
            ttft = f"({entry['ttft_ms']:.2f})"
        else:
            p50 = " / ".join(f"{summary['added'][name][c]['p50_ms']:.2f}" for c in cs)
            p99 = " / ".join(f"{summary['added'][name][c]['p99_ms']:.2f}" for c in cs)
            ttft = f"{summary['ttft_added_ms'][name]:.2f}"
        cpu = " / ".join(f"{entry['json'][c]['cpu_ms_per_request']:.3f}" for c in cs)
        streams = f"{entry['stream']['cpu_ms_per_request']:.3f}"
        if "stream_paced" in entry:
            streams += f" / {entry['stream_paced']['cpu_ms_per_request']:.3f}"
        lines.append(
            f"| {name} | {p50} | {p99} | {summary['max_rps'][name]:,.0f} | {cpu} "
            f"| {streams} | {ttft} | {entry['rss_mb']:.0f} |"
        )
    lines += [
        "",
        "direct shows absolute values in parentheses. Streams: back to back, the fake backend "
        "writes all 18 events at once (they reach the proxy in one or two reads and leave in "
        "as many writes); paced, they are 1 ms apart, one read and one write each, as from a "
        "decoding engine. The stream target below is read on the back-to-back stream.",
        "",
        "| target | value | met |",
        "|---|---|---|",
    ]
    for check, value in summary["checks"].items():
        lines.append(f"| {check} | {value:.3f} | {_passes(check, value)} |")
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = [str(c) for c in results["concurrency"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, added in summary["added"].items():
        left.plot([int(c) for c in cs], [added[c]["p50_ms"] for c in cs], marker="o", label=name)
    left.set_xscale("log", base=2)
    left.set_yscale("symlog", linthresh=1)
    left.set_xlabel("concurrency")
    left.set_ylabel("added p50 latency (ms)")
    left.legend()
    names = list(summary["max_rps"])
    right.bar(names, [summary["max_rps"][n] for n in names])
    right.set_yscale("log")
    right.set_ylabel("max requests/s")
    fig.suptitle(f"gateway overhead ({results['date']}, {results['machine']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def block_arguments(doc: str, results_dir: Path) -> argparse.Namespace:
    """The options of the in-process benchmarks: interleaved rounds of blocks."""
    parser = argparse.ArgumentParser(description=doc.split("\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=400)
    parser.add_argument("--out", type=Path, default=results_dir)
    return parser.parse_args()


def stamped(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """`results` with the date, the machine and the rounds they were measured in."""
    return results | {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "rounds": args.rounds,
        "block": args.block,
    }


def write_results(directory: Path, stem: str, results: dict[str, Any], text: str) -> None:
    """`<stem>.json` and `<stem>.md` in `directory`, and the markdown on stdout."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (directory / f"{stem}.md").write_text(text)
    print(text)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument(
        "--long-requests", type=int, default=50_000, help="per long run (two runs); 0 skips"
    )
    parser.add_argument(
        "--compiled",
        type=Path,
        help=f"a TIERGATE_COMPILE=1 install (pip --target DIR): adds the {COMPILED} target",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit(
            "wrk is required (Debian package wrk; tests/tools/install_system_deps.sh installs it)"
        )
    results = measure(args)
    results["date"] = datetime.date.today().isoformat()
    results["machine"] = (
        f"{os.cpu_count()} cores, {_cpu_model()}, Python {platform.python_version()}"
    )
    results["duration_s"] = args.duration
    summary = summarise(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "overhead.json").write_text(
        json.dumps({"results": results, "summary": summary}, indent=2)
    )
    table = markdown(results, summary)
    (RESULTS / "overhead.md").write_text(table)
    chart(results, summary, RESULTS / "overhead.png")
    print(table)


if __name__ == "__main__":
    main()
