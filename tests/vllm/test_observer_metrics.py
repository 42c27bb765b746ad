"""The live observer scrapes real vLLM `/metrics`: its counters and C equal the engine's.

The engine is scraped independently here (prometheus_client's parser, not the gateway's)
before and after a run; the observer's view over the same run must agree exactly, because
both see the same counters and the first observer scrape lands before any traffic.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import fields
from typing import Any

import pytest
from openai import OpenAI

from gateway.observer.acceptance import inverse_accepted_per_round
from gateway.observer.vllm_metrics import CounterDeltas, counter_deltas
from tests.vllm.deployment import ENGINE_API_KEY, Deployment, VllmServer
from tests.vllm.support import (
    PUBLIC_MODEL,
    EngineScrape,
    admin_get,
    client,
    observed_gateway,
    settled_scrape,
    wait_for,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

# The raw counter behind each CounterDeltas field (request_success sums every reason).
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
}


def raw_deltas(before: EngineScrape, after: EngineScrape) -> dict[str, float | None]:
    return {
        attr: after.delta(before, name) if after.has(name) else None for attr, name in RAW.items()
    }


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


def hold_streams(
    server: VllmServer, count: int, stop: threading.Event, starts: list[float]
) -> list[threading.Thread]:
    """`count` long greedy streams straight to the engine, held until `stop` is set. A stream
    ends by itself at max_model_len (seconds on a quiet machine); they are then started again
    together, and the time of every start goes to `starts`, so a reader knows when the
    plateau began. Together: the same prompt length and token budget make them end together,
    so a plateau lasts a whole stream (restarted one by one, the last restart was seldom 3 s
    old on a fast host, and the test waited for a plateau it never saw)."""
    engine = OpenAI(base_url=f"{server.url}/v1", api_key=ENGINE_API_KEY, max_retries=0, timeout=120)
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        while not stop.is_set():
            try:
                barrier.wait(timeout=120)
            except threading.BrokenBarrierError:
                return  # stopping: another stream broke the barrier on its way out
            starts.append(time.monotonic())
            stream = engine.completions.create(
                model=server.served_model_name,
                prompt=f"stream {i}: once upon a time",
                max_tokens=1000,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            with stream:
                for _ in stream:
                    if stop.is_set():
                        break
        barrier.abort()  # the streams still waiting to restart stop too

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


def engine_concurrency(server: VllmServer) -> float:
    scrape = EngineScrape.of(server)
    return scrape.value("vllm:num_requests_running") + scrape.value("vllm:num_requests_waiting")


def test_observer_concurrency_is_the_engines(deployment: Deployment) -> None:
    """Six streams held in the `prefix` engine, straight to vLLM (not through the gateway):
    with a 1 s window, every observer scrape in it lands on the plateau, which our own
    scrapes before and after reading the view bracket (and no stream restarted since). A
    plateau lasts one stream, about 6 s on a loaded host: the shorter the window, the more
    of it is left to read the view and the plan in (with a 2 s window a CI run saw none)."""
    server = deployment["prefix"]
    held = 6
    window = {"window_s": 1.0, "bucket_s": 0.5, "scrape_interval_s": 0.1}
    stop = threading.Event()
    with observed_gateway(deployment, observer_overrides=window) as gw:
        starts: list[float] = []
        threads = hold_streams(server, held, stop, starts)
        try:
            seen: list[tuple[float, float]] = []  # (engine concurrency, plateau age)

            def bracketed() -> tuple[dict[str, Any], dict[str, Any]] | None:
                before = engine_concurrency(server)
                # The last (re)start: the plateau cannot be older. The window is 1 s; the extra
                # second covers the time a request takes to reach the engine.
                began = max(starts, default=time.monotonic())
                seen.append((before, time.monotonic() - began))
                if before != held or time.monotonic() - began < 2.0:
                    return None  # not yet a window's worth of plateau: try again
                view = admin_get(gw, "/admin/regime")["tiers"]
                plan = admin_get(gw, "/admin/plan?refresh=1")["tiers"]
                after = engine_concurrency(server)
                if after != held or max(starts) != began:
                    return None  # a stream ended (and restarted) while the view was read
                # A scrape can be late on two busy cores; the next view will have one.
                return (view, plan) if view["prefix"]["concurrency"]["engine_mean"] else None

            try:
                view, plan = wait_for(bracketed, "an observer view read on the plateau", 150)
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}; last (concurrency, plateau age): {seen[-20:]}"
                ) from None
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
    assert view["prefix"]["concurrency"]["engine_mean"] == held
    assert view["plain"]["concurrency"]["engine_mean"] in {0.0, None}
    assert view["spec"]["concurrency"]["engine_mean"] in {0.0, None}
    # No traffic went through the gateway, so the planner's C is the engine's.
    assert plan["prefix"]["regime"]["concurrency"] == held
    wait_for(lambda: engine_concurrency(server) == 0, "the held streams to be aborted")
