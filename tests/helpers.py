"""Test harness: real sockets on 127.0.0.1 for simulated tiers and the gateway.

Simulated tiers run as child processes (as `tiergate up` runs them); the gateway runs
in-process on a background thread so tests can read its metrics registry directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from prometheus_client import CollectorRegistry

from gateway.app import Gateway, PolicyFactory, build_app
from gateway.config import Settings, parse_settings
from gateway.launcher import SimSpec, gateway_config, stop_processes, wait_healthy

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
API_KEY = "sk-test-key"
# What the `keyed_ladder` simulators want on /v1, as a vLLM started with --api-key.
ENGINE_KEY = "sk-engine-test"
MODEL = "qwen3-30b-a3b"


T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout_s: float = 5.0) -> T:
    """`probe()` once it is truthy, else its last value after `timeout_s`.

    For state the gateway changes after a response's last byte (circuits, in-flight
    counts, listeners): a client can finish reading before the gateway gets there.
    """
    deadline = time.monotonic() + timeout_s
    value = probe()
    while not value and time.monotonic() < deadline:
        time.sleep(0.01)
        value = probe()
    return value


def free_port() -> int:
    """A port nothing listens on yet, for a server started later: one the kernel picks
    for bind(0) is in the ephemeral range, where another bind(0) or an outgoing
    connection can take it before that server binds it (see free_port_block)."""
    return free_port_block(1)


# Every port free_port_block has handed out in this session. The vLLM deployment binds its
# ports a minute or more after taking them (tests/vllm/preparation.py), while other tests
# run: a later block must not reuse them.
_HANDED_OUT: set[int] = set()
_HANDING_OUT = threading.Lock()


def free_port_block(count: int) -> int:
    """First of `count` consecutive free ports, below the kernel's ephemeral range (32768 and
    up by default), where outgoing connections take their ports: `free_port() + 1` can be
    taken by one of those at any moment. No port is handed out twice in a session."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        block = range(base, base + count)
        with _HANDING_OUT, contextlib.ExitStack() as held:
            if not _HANDED_OUT.isdisjoint(block):
                continue
            try:
                for port in block:
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.update(block)
            return base
    raise RuntimeError(f"no block of {count} free ports found")


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def send(
    method: str,
    url: str,
    body: Any = None,
    *,
    key: str | None = API_KEY,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Reply:
    """One HTTP request; `body` is JSON-encoded unless it is bytes; 4xx/5xx are returned."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if key is not None:
        request.add_header("authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("content-type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, _lower(response.headers.items()), response.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, _lower(exc.headers.items()), exc.read())


def _lower(items: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in items}


def http_json(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    reply = send(method, url, body, key=None, headers=headers)
    try:
        return reply.status, reply.json() if reply.body else None
    except json.JSONDecodeError:
        return reply.status, reply.body.decode()


@dataclass
class Sim:
    """A simulated tier process."""

    precision: str
    port: int
    served_model_name: str
    process: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Sim:
        spec = SimSpec(
            self.precision, self.port, self.served_model_name, extra_args=self.extra_args
        )
        self.process = subprocess.Popen(spec.argv(), start_new_session=True)
        wait_healthy(f"{self.url}/health", 30, self.process)
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_processes([self.process])
            self.process = None

    def faults(self, **changes: Any) -> dict[str, Any]:
        status, body = http_json("POST", f"{self.url}/sim/faults", changes)
        assert status == 200, body
        return dict(body)

    def stats(self) -> dict[str, Any]:
        status, body = http_json("GET", f"{self.url}/sim/stats")
        assert status == 200, body
        return dict(body)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            return str(response.read().decode())


@dataclass
class Ladder:
    """Three simulated tiers, cheapest first."""

    sims: list[Sim] = field(default_factory=list)

    @classmethod
    def start(
        cls, precisions: Sequence[str] = ("nvfp4", "w4a16", "bf16"), extra_args: Sequence[str] = ()
    ) -> Ladder:
        ladder = cls(
            [Sim(p, free_port(), f"{MODEL}-{p}", extra_args=tuple(extra_args)) for p in precisions]
        )
        try:
            for sim in ladder.sims:
                sim.start()
        except BaseException:
            ladder.stop()
            raise
        return ladder

    def stop(self) -> None:
        for sim in self.sims:
            sim.stop()

    def settings(self, **overrides: Any) -> Settings:
        data: dict[str, Any] = {
            "model": MODEL,
            "tiers": [
                {
                    "name": sim.precision,
                    "precision": sim.precision,
                    "endpoints": [f"{sim.url}/v1"],
                    "served_model_name": sim.served_model_name,
                }
                for sim in self.sims
            ],
            "tenants": [{"name": "default", "api_keys": [API_KEY]}],
            "resilience": {"health_interval_s": 0.5},
        }
        data.update(overrides)
        return parse_settings(data)


class GatewayThread:
    """The gateway under uvicorn on a background thread, on a free port."""

    def __init__(
        self,
        settings: Settings,
        *,
        policy_factory: PolicyFactory | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.port = free_port()
        self.app: Gateway = build_app(
            settings,
            registry=self.registry,
            environ=environ if environ is not None else {},
            policy_factory=policy_factory,
        )
        config = gateway_config(self.app, "127.0.0.1", self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GatewayThread:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def flush(self) -> None:
        """Flushes the gateway's batched metrics, on the gateway's own event loop."""
        assert self.loop is not None
        done = threading.Event()

        def run() -> None:
            self.app.metrics.flush()
            done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait(5)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        self.flush()
        value = self.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else float(value)

    def metric_at_least(self, name: str, labels: dict[str, str], minimum: float) -> float:
        """Waits briefly (requests are recorded just after their last byte) for `minimum`."""
        deadline = time.monotonic() + 5
        while self.metric(name, labels) < minimum and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.metric(name, labels)

    def settled_metric(
        self, name: str, labels: dict[str, str] | None = None, expected: float | None = None
    ) -> float:
        """The metric once the request that should move it has been recorded.

        A request is recorded just after its last byte is sent, so a client can finish
        reading before the counter moves; wait briefly for `expected` (or any change).
        """
        deadline = time.monotonic() + 5
        value = self.metric(name, labels)
        while time.monotonic() < deadline and (
            value != expected if expected is not None else False
        ):
            time.sleep(0.01)
            value = self.metric(name, labels)
        return value


@contextlib.contextmanager
def gateway(settings: Settings, **kwargs: Any) -> Iterator[GatewayThread]:
    with GatewayThread(settings, **kwargs) as running:
        yield running


def require_shared_data(relative: str) -> Path:
    """A shared data file; absent data fails in CI and skips elsewhere."""
    import pytest

    path = SHARED_DATA / relative
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared data missing in CI: {path}")
        pytest.skip(f"shared data not available: {path}")
    return path


class FixedPolicy:
    """A routing policy for tests: always the given ladder tier (clamped to the tenant's)."""

    def __init__(self, tier: int, probabilities: tuple[float, ...] | None = None) -> None:
        self.tier = tier
        self.probabilities = probabilities

    def decide(self, request: Any, kind: Any, tenant: Any) -> Any:
        from gateway.routing.policy import Decision

        allowed = [t for t in tenant.allowed_tiers if t >= self.tier] or [tenant.top_tier]
        chosen = allowed[0]
        p = None if self.probabilities is None else self.probabilities[chosen]
        return Decision(
            tier=chosen, probability=p, reason="fixed", probabilities=self.probabilities
        )


def fixed_policy(tier: int, probabilities: tuple[float, ...] | None = None) -> PolicyFactory:
    return lambda _settings: FixedPolicy(tier, probabilities)


class GatewayProcess:
    """`tiergate serve` as a child process, configured from a YAML file (reload tests)."""

    def __init__(
        self,
        config_path: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.config_path = config_path
        self.port = port or free_port()
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path  # stdout and stderr go here when given
        self.process: subprocess.Popen[bytes] | None = None
        self.argv_extra: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GatewayProcess:
        argv = [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "serve",
            "--config",
            str(self.config_path),
            "--port",
            str(self.port),
            *self.argv_extra,
        ]
        output = None if self.log_path is None else self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                argv,
                env=self.env,
                start_new_session=True,
                stdout=output,
                stderr=None if output is None else subprocess.STDOUT,
            )
        finally:
            if output is not None:
                output.close()  # the child holds its own descriptor
        wait_healthy(f"{self.url}/health", 30, self.process)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            stop_processes([self.process])


def write_settings(path: Path, settings: Settings) -> Path:
    """Writes settings as YAML, keys in clear (tests only)."""
    import yaml

    data = settings.model_dump(mode="json")
    for tenant, original in zip(data["tenants"], settings.tenants, strict=True):
        tenant["api_keys"] = [key.get_secret_value() for key in original.api_keys]
    path.write_text(yaml.safe_dump(data))
    return path


def require_binary(name: str) -> str:
    """A system binary's path; missing is a failure in CI (the test command installs it)."""
    import shutil

    import pytest

    path = shutil.which(name)
    if path is None:
        why = f"`{name}` is not installed (tests/tools/install_system_deps.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI must run this test")
        pytest.skip(why)
    return path
