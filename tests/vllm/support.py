"""Helpers for the real-vLLM tests: gateway settings for the deployment, engine scrapes,
the admin API, and waiting for counters that move just after a response ends."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import PolicyFactory
from gateway.config import Settings, parse_settings
from gateway.observer.vllm_metrics import VllmMetricsSnapshot, parse_vllm_metrics
from tests.helpers import API_KEY, GatewayThread
from tests.vllm.deployment import ENGINE_API_KEY, Deployment, VllmServer, group_members

PUBLIC_MODEL = "tiny-moe"
ENGINE_HEADERS = {"content-type": "application/json", "authorization": f"Bearer {ENGINE_API_KEY}"}
ADMIN_TOKEN = "vllm-tests-admin"
T = TypeVar("T")


def gateway_settings(deployment: Deployment, **overrides: Any) -> Settings:
    """Tiers in the deployment's order (plain, prefix, spec), each with the flags it runs."""
    data: dict[str, Any] = {
        "model": PUBLIC_MODEL,
        "tiers": [
            {
                "name": name,
                "precision": server.spec.precision,
                "endpoints": [f"{server.url}/v1"],
                "served_model_name": server.served_model_name,
                "vllm_args": server.served_args,
                "api_key": ENGINE_API_KEY,
            }
            for name, server in deployment.servers.items()
        ],
        "tenants": [{"name": "default", "api_keys": [API_KEY]}],
        "resilience": {"health_interval_s": 0.5},
        "timeouts": {"connect_s": 2.0, "first_byte_s": 60.0, "total_s": 120.0},
        "planner": deployment.planner,
        "admin": {"token": ADMIN_TOKEN},
        "observer": {"enabled": False},
    }
    data.update(overrides)
    return parse_settings(data)


def client(gw: GatewayThread) -> OpenAI:
    return OpenAI(base_url=f"{gw.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def admin_get(gw: GatewayThread, path: str) -> Any:
    request = urllib.request.Request(
        f"{gw.url}{path}", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def gateway_metric(gw: GatewayThread, name: str, **labels: str) -> float:
    """A sample of the gateway's own `/metrics` page (scraping flushes its batched counters);
    0 when absent."""
    with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def post_json(url: str, body: dict[str, Any]) -> Any:
    """POSTs to a vLLM server directly, with the engines' key."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=ENGINE_HEADERS)
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def wait_for(
    probe: Callable[[], T | None], what: str, timeout_s: float = 20.0, every_s: float = 0.1
) -> T:
    """The first truthy value of `probe()`; fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


@dataclass(frozen=True)
class EngineScrape:
    """One scrape of a vLLM `/metrics` page, read independently of the gateway's parser."""

    text: str
    samples: tuple[tuple[str, tuple[tuple[str, str], ...], float], ...]
    model_name: str

    @classmethod
    def of(cls, server: VllmServer) -> EngineScrape:
        text = server.metrics_text()
        samples = tuple(
            (s.name, tuple(sorted(s.labels.items())), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        )
        return cls(text, samples, server.served_model_name)

    def has(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.samples)

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return sum(
            v
            for n, ls, v in self.samples
            if n == name and all((k, val) in ls for k, val in labels.items())
        )

    def labels(self, name: str) -> dict[str, str]:
        for n, ls, _ in self.samples:
            if n == name:
                return dict(ls)
        raise KeyError(name)

    @property
    def snapshot(self) -> VllmMetricsSnapshot:
        return parse_vllm_metrics(self.text, self.model_name)

    def delta(self, before: EngineScrape, name: str, **labels: str) -> float:
        return self.value(name, **labels) - before.value(name, **labels)


def finished_requests(server: VllmServer) -> float:
    return EngineScrape.of(server).value("vllm:request_success_total")


def settled_scrape(server: VllmServer, before: EngineScrape, requests: int) -> EngineScrape:
    """The scrape once `requests` more requests have finished and nothing runs: the engine
    updates its counters just after the last byte of a response."""

    def probe() -> EngineScrape | None:
        now = EngineScrape.of(server)
        done = now.delta(before, "vllm:request_success_total") >= requests
        idle = now.value("vllm:num_requests_running") + now.value("vllm:num_requests_waiting") == 0
        return now if done and idle else None

    return wait_for(probe, f"{requests} finished requests on {server.spec.name}")


def requests_in(scrape: EngineScrape) -> float:
    """Requests the engine holds (running or waiting) in that scrape."""
    return scrape.value("vllm:num_requests_running") + scrape.value("vllm:num_requests_waiting")


def still_generating(server: VllmServer, before: EngineScrape, max_tokens: int) -> EngineScrape:
    """A scrape showing that the one request sent since `before` has begun and not
    finished: no request_success, and between 1 and `max_tokens` tokens generated."""
    now = EngineScrape.of(server)
    generated = now.delta(before, "vllm:generation_tokens_total")
    finished = now.delta(before, "vllm:request_success_total")
    assert finished == 0 and 0 < generated < max_tokens, (finished, generated)
    return now


def model_worker_pid(server: VllmServer) -> int:
    """The server's model worker process (vLLM titles it `VLLM::Worker...`). While it is
    stopped no step completes, so no token is generated; the engine core and the API server
    still run: they take aborts and stream out what was generated before."""
    assert server.process is not None
    for pid in group_members(server.process.pid):
        with contextlib.suppress(OSError):
            if b"VLLM::Worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError(f"no model worker in {server.spec.name}'s process group")


def first_event_paused(
    server: VllmServer, start: Callable[[], T], settle_s: float = 1.0, timeout_s: float = 60.0
) -> T:
    """Runs `start` (a streaming request to `server`'s tier that returns once the client
    has its first event) so that the engine pauses (`POST /pause?mode=keep`) right after
    the request's first step: the model worker is stopped (SIGSTOP) while the request is
    sent and the pause is queued behind the step that waits for it, then let go. The engine
    then holds the request, with a token or two generated, until `/resume`, however slowly
    the test acts next. Pausing once the client had its first event was often too late
    under load: the tiny model decodes hundreds of tokens a second, the API server was busy
    streaming them, and the pause landed after the whole answer; so did a short SIGCONT
    window of the worker, once held up for seconds. `settle_s` lets the request, then the
    pause, reach the idle engine core (nothing is generated meanwhile)."""
    worker = model_worker_pid(server)
    os.kill(worker, signal.SIGSTOP)
    with ThreadPoolExecutor(max_workers=2) as pool:
        try:
            started = pool.submit(start)
            time.sleep(settle_s)  # the request reaches the core, which waits for the worker
            paused = pool.submit(post_json, f"{server.url}/pause?mode=keep", {})
            time.sleep(settle_s)  # the pause waits in the core's queue, behind that step
        finally:
            os.kill(worker, signal.SIGCONT)
        try:
            paused.result(timeout=timeout_s)
            return started.result(timeout=timeout_s)
        except BaseException:
            resume_engine(server)  # lets `start` end, so that the pool can close
            raise


def resume_engine(server: VllmServer) -> None:
    post_json(f"{server.url}/resume", {})


@contextlib.contextmanager
def observed_gateway(
    deployment: Deployment,
    *,
    policy_factory: PolicyFactory | None = None,
    observer_overrides: dict[str, Any] | None = None,
    **overrides: Any,
) -> Iterator[GatewayThread]:
    """A gateway whose observer samples every request and scrapes every 0.5 s; yields once
    each tier has been scraped, so engine deltas and replay cover the same requests."""
    observer = {
        "enabled": True,
        "sample_rate": 1.0,
        "scrape_interval_s": 0.5,
        "plan_interval_s": 3600,
        "window_s": 900,
        "bucket_s": 5,
        **(observer_overrides or {}),
    }
    settings = gateway_settings(deployment, observer=observer, **overrides)
    with GatewayThread(settings, policy_factory=policy_factory) as gw:
        wait_for(
            lambda: all(
                tier["concurrency"]["engine_mean"] is not None
                for tier in admin_get(gw, "/admin/regime")["tiers"].values()
            ),
            "the observer's first scrape of every tier",
        )
        yield gw


__all__ = [
    "ADMIN_TOKEN",
    "ENGINE_HEADERS",
    "PUBLIC_MODEL",
    "EngineScrape",
    "admin_get",
    "client",
    "finished_requests",
    "first_event_paused",
    "gateway_metric",
    "gateway_settings",
    "model_worker_pid",
    "observed_gateway",
    "post_json",
    "requests_in",
    "resume_engine",
    "settled_scrape",
    "still_generating",
    "wait_for",
]
