"""The live observer scrapes real vLLM `/metrics`: its counters and C equal the engine's.

The engine is scraped independently here (prometheus_client's parser, not the gateway's)
before and after a run; the observer's view over the same run must agree exactly, because
both see the same counters and the first observer scrape lands before any traffic.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields
from threading import Semaphore
from typing import Any

import pytest

from gateway.observer.acceptance import inverse_accepted_per_round
from gateway.observer.vllm_metrics import CounterDeltas, counter_deltas
from tests.vllm.deployment import Deployment, VllmServer
from tests.vllm.support import (
    ENGINE_HEADERS,
    PUBLIC_MODEL,
    EngineScrape,
    admin_get,
    client,
    observed_gateway,
    post_json,
    settled_scrape,
    wait_for,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

# The raw counter behind each CounterDeltas field (request_success sums every reason; the
# finished_* fields are vLLM's histograms of tokens per finished request).
RAW = {
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "spec_decode_num_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "request_success": "vllm:request_success_total",
    "num_preemptions": "vllm:num_preemptions_total",
    "finished_prompt_tokens": "vllm:request_prompt_tokens_sum",
    "finished_output_tokens": "vllm:request_generation_tokens_sum",
    "finished_requests": "vllm:request_prompt_tokens_count",
}


def raw_deltas(before: EngineScrape, after: EngineScrape) -> dict[str, float | None]:
    deltas = {
        attr: after.delta(before, name) if after.has(name) else None for attr, name in RAW.items()
    }
    # The speculating engine's generated tokens, for A_obs (None where it does not speculate).
    speculates = deltas["spec_decode_num_drafts"] is not None
    return deltas | {"spec_generation_tokens": deltas["generation_tokens"] if speculates else None}


def expected_view(d: CounterDeltas) -> dict[str, float | None]:
    a_obs = d.tokens_per_round
    return {
        "rho": d.rho,
        "a_obs": a_obs,
        "r_engine": None if a_obs is None else min(1.0, inverse_accepted_per_round(a_obs, 4)),
        "l_in": d.l_in,
        "l_out": d.l_out,
    }


def observed_view(tier: dict[str, object]) -> dict[str, float | None]:
    rho, r, lengths = tier["rho"], tier["r"], tier["lengths"]
    assert isinstance(rho, dict) and isinstance(r, dict) and isinstance(lengths, dict)
    return {
        "rho": rho["engine"],
        "a_obs": r["a_obs"],
        "r_engine": r["r_engine"],
        "l_in": lengths["l_in"],
        "l_out": lengths["l_out"],
    }


def close(a: dict[str, float | None], b: dict[str, float | None]) -> bool:
    return a.keys() == b.keys() and all(
        (a[k] is None) == (b[k] is None) and (a[k] is None or a[k] == pytest.approx(b[k]))
        for k in a
    )


def test_observer_counters_equal_the_engine(deployment: Deployment) -> None:
    system = {"role": "system", "content": f"[{uuid.uuid4()}] " + "Keep the ledger tidy. " * 60}
    with observed_gateway(deployment) as gw:
        sdk = client(gw)
        before = {name: EngineScrape.of(s) for name, s in deployment.servers.items()}
        for i in range(5):
            for tier in deployment.servers:
                sdk.chat.completions.create(
                    model=f"{PUBLIC_MODEL}@{tier}",
                    messages=[system, {"role": "user", "content": f"entry {i}: total it"}],
                    max_tokens=48,
                    temperature=0,
                    extra_body={"ignore_eos": True},
                )
        after = {name: settled_scrape(s, before[name], 5) for name, s in deployment.servers.items()}
        expected = {}
        for name in deployment.servers:
            # The gateway's parser reads the real page as prometheus_client does.
            parsed = counter_deltas(before[name].snapshot, after[name].snapshot)
            assert {f.name: getattr(parsed, f.name) for f in fields(parsed)} == raw_deltas(
                before[name], after[name]
            )
            expected[name] = expected_view(parsed)

        def caught_up() -> dict[str, Any] | None:
            # The observer scrapes every 0.5 s; its window sums the same deltas.
            view: dict[str, Any] = admin_get(gw, "/admin/regime")
            done = all(close(observed_view(view["tiers"][n]), expected[n]) for n in expected)
            return view if done else None

        view = wait_for(caught_up, "the observer to catch up with the engine counters")
    tiers = view["tiers"]
    assert tiers["plain"]["rho"]["engine"] is None  # APC off: vLLM counts no queries
    assert tiers["prefix"]["rho"]["engine"] > 0.5  # the shared system prompt hits
    assert tiers["spec"]["r"]["a_obs"] > 1.0
    assert tiers["plain"]["r"]["a_obs"] is None and tiers["prefix"]["r"]["a_obs"] is None


def send_together(server: VllmServer, count: int) -> tuple[list[threading.Thread], Semaphore]:
    """`count` long greedy streams straight to the engine, each from its own thread, read
    raw (six threads parsing SSE here, beside the in-process gateway, slowed every scrape).
    Each thread releases the semaphore once its first event arrives: that request runs."""
    body = {
        "model": server.served_model_name,
        "max_tokens": 1000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = Semaphore(0)

    def run(prompt: str) -> None:
        data = json.dumps({**body, "prompt": prompt}).encode()
        request = urllib.request.Request(
            f"{server.url}/v1/completions", data=data, headers=ENGINE_HEADERS
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            response.readline()
            started.release()
            response.read()

    threads = [
        threading.Thread(target=run, args=(f"story {i}: once",), daemon=True) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads, started


@dataclass(frozen=True)
class Load:
    """What one scrape says the engine holds and has done."""

    concurrency: float
    generated: float

    @classmethod
    def of(cls, server: VllmServer) -> Load:
        scrape = EngineScrape.of(server)
        return cls(
            scrape.value("vllm:num_requests_running") + scrape.value("vllm:num_requests_waiting"),
            scrape.value("vllm:generation_tokens_total"),
        )


def engine_concurrency(server: VllmServer) -> float:
    return Load.of(server).concurrency


@contextlib.contextmanager
def held_in_pause(server: VllmServer, count: int, attempts: int = 5) -> Iterator[Load]:
    """`count` requests frozen in the engine by vLLM's `POST /pause?mode=keep` (the
    scheduler keeps its requests and steps no more) until `/resume`; yields the engine's
    load once paused. The engine then holds them for as long as the test needs and leaves
    both cores to the observer: running, six requests kept the engine core and its worker
    busy, every scrape took seconds, and a plateau of a few seconds was often missed (a CI
    run saw none in 150 s). The pause is sent once every stream has its first event: a
    scrape of a busy engine could take longer than the requests (under load it always
    did). Should the pause still come late, the engine is resumed and a new batch sent."""
    missed: list[Load] = []  # the load once paused, when it was not `count`
    for _ in range(attempts):
        threads, started = send_together(server, count)
        try:
            if not all(started.acquire(timeout=60) for _ in range(count)):
                raise AssertionError(f"{count} streams did not all start in 60 s")
            post_json(f"{server.url}/pause?mode=keep", {})
            try:
                load = Load.of(server)
                if load.concurrency == count:
                    yield load
                    return
                missed.append(load)
            finally:
                post_json(f"{server.url}/resume", {})
        finally:
            for thread in threads:
                thread.join(timeout=120)
    raise AssertionError(f"no pause caught {count} requests running: {missed}")


def test_observer_concurrency_is_the_engines(deployment: Deployment) -> None:
    """Six requests held in the paused `prefix` engine, sent straight to vLLM (not through
    the gateway): the observer's 1 s window then reads six in every scrape, and so does the
    planner's C. The engine is paused only once all six run, and no token is generated while
    the view is read, so the plateau is the engine's own, not a guess from timing."""
    server = deployment["prefix"]
    held = 6
    window_s = 1.0
    window = {"window_s": window_s, "bucket_s": 0.5, "scrape_interval_s": 0.1}
    with (
        observed_gateway(deployment, observer_overrides=window) as gw,
        held_in_pause(server, held) as frozen,
    ):
        # A window after the pause, and a second more for a scrape sent before it.
        time.sleep(window_s + 1.0)

        def scraped() -> dict[str, Any] | None:
            tiers: dict[str, Any] = admin_get(gw, "/admin/regime")["tiers"]
            return tiers if tiers["prefix"]["concurrency"]["engine_mean"] else None

        view = wait_for(scraped, "an observer scrape in the window")
        plan = admin_get(gw, "/admin/plan?refresh=1")["tiers"]
        assert Load.of(server) == frozen  # nothing moved while the view was read
    assert view["prefix"]["concurrency"]["engine_mean"] == held
    assert view["plain"]["concurrency"]["engine_mean"] in {0.0, None}
    assert view["spec"]["concurrency"]["engine_mean"] in {0.0, None}
    # No traffic went through the gateway, so the planner's C is the engine's.
    assert plan["prefix"]["regime"]["concurrency"] == held
    # Resumed, the requests ran to their end.
    wait_for(lambda: engine_concurrency(server) == 0, "the held requests to finish")
