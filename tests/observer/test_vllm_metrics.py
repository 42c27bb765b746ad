"""Parsing vLLM's /metrics exposition, produced here with prometheus_client like vLLM does."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.observer.vllm_metrics import (
    VllmMetricsSnapshot,
    counter_deltas,
    parse_vllm_metrics,
)

LABELS = ["model_name", "engine"]


def exposition(scale: float = 1.0, with_spec: bool = True, model: str = "qwen") -> str:
    reg = CollectorRegistry()
    Gauge("vllm:num_requests_running", "", LABELS, registry=reg).labels(model, "0").set(6)
    Gauge("vllm:num_requests_waiting", "", LABELS, registry=reg).labels(model, "0").set(2)
    Gauge("vllm:kv_cache_usage_perc", "", LABELS, registry=reg).labels(model, "0").set(0.4)
    counters = {
        "vllm:prefix_cache_queries": 1000,
        "vllm:prefix_cache_hits": 400,
        "vllm:generation_tokens": 3000,
        "vllm:prompt_tokens": 20000,
        "vllm:num_preemptions": 0,
    }
    if with_spec:
        counters |= {
            "vllm:spec_decode_num_drafts": 800,
            "vllm:spec_decode_num_draft_tokens": 3200,
            "vllm:spec_decode_num_accepted_tokens": 1000,
        }
    for name, value in counters.items():
        c = Counter(name, "", LABELS, registry=reg)
        c.labels(model, "0").inc(value * scale)
        c.labels(model, "1").inc(value * scale)  # a second engine (data parallel)
    success = Counter("vllm:request_success", "", [*LABELS, "finished_reason"], registry=reg)
    success.labels(model, "0", "stop").inc(8 * scale)
    success.labels(model, "0", "length").inc(2 * scale)
    Histogram("vllm:iteration_tokens_total", "", LABELS, registry=reg).labels(model, "0").observe(3)
    info = Gauge(
        "vllm:cache_config_info",
        "",
        [
            "block_size",
            "num_gpu_blocks",
            "enable_prefix_caching",
            "cache_dtype",
            "gpu_memory_utilization",
        ],
        registry=reg,
    )
    info.labels("16", "81920", "True", "bfloat16", "0.92").set(1)
    return generate_latest(reg).decode()


def test_parse_snapshot() -> None:
    snap = parse_vllm_metrics(exposition())
    assert (snap.num_requests_running, snap.num_requests_waiting) == (6, 2)
    assert snap.concurrency == 8
    assert snap.prefix_cache_queries == 2000 and snap.prefix_cache_hits == 800  # two engines
    assert snap.spec_decode_num_accepted_tokens == 2000
    assert snap.request_success == 10
    assert snap.kv_cache_usage_perc == pytest.approx(0.4)
    info = snap.cache_config
    assert info is not None
    assert (info.num_gpu_blocks, info.block_size, info.enable_prefix_caching) == (81920, 16, True)
    assert info.gpu_memory_utilization == 0.92 and info.cache_dtype == "bfloat16"
    assert info.knee(4096) == 320


def test_absent_counters_are_none() -> None:
    snap = parse_vllm_metrics(exposition(with_spec=False))
    assert snap.spec_decode_num_drafts is None
    empty = parse_vllm_metrics("")
    assert empty.concurrency is None and empty.cache_config is None


def test_model_filter() -> None:
    assert parse_vllm_metrics(exposition(), model_name="other").prefix_cache_hits is None


def test_deltas_and_derived_quantities() -> None:
    a, b = parse_vllm_metrics(exposition(1.0)), parse_vllm_metrics(exposition(3.0))
    d = counter_deltas(a, b)
    assert d.prefix_cache_queries == 4000 and d.rho == pytest.approx(0.4)
    # A_obs = gen / (gen - accepted) = 12000 / (12000 - 4000).
    assert d.tokens_per_round == pytest.approx(1.5)
    assert d.coverage == pytest.approx(3200 / 8000)
    assert d.l_in == pytest.approx(80000 / 20) and d.l_out == pytest.approx(12000 / 20)
    # A restart resets counters: the new values count on their own.
    assert counter_deltas(b, a).prefix_cache_queries == 2000
    summed = d + d
    assert summed.prefix_cache_hits == 2 * 1600 and summed.rho == pytest.approx(0.4)


def test_a_restart_resets_every_counter_at_once() -> None:
    # Before the restart: 1000 generated, 900 accepted. After it the engine has generated 1200
    # (already past the old count) and accepted 300: all of that is new, A_obs = 1200 / 900.
    before = VllmMetricsSnapshot(
        generation_tokens=1000,
        spec_decode_num_accepted_tokens=900,
        spec_decode_num_drafts=100,
        prefix_cache_queries=5000,
        prefix_cache_hits=4500,
    )
    after = VllmMetricsSnapshot(
        generation_tokens=1200,
        spec_decode_num_accepted_tokens=300,
        spec_decode_num_drafts=250,
        prefix_cache_queries=6000,
        prefix_cache_hits=1000,
    )
    d = counter_deltas(before, after)
    assert d.generation_tokens == 1200 and d.prefix_cache_queries == 6000
    assert d.tokens_per_round == pytest.approx(1200 / 900)
    assert d.rho == pytest.approx(1000 / 6000)
    # The per-request histograms' counts restart too: one that went down marks a restart.
    before = VllmMetricsSnapshot(generation_tokens=10, finished_requests=5)
    after = VllmMetricsSnapshot(generation_tokens=20, finished_requests=2)
    assert counter_deltas(before, after).finished_requests == 2


def test_no_spec_no_a_obs() -> None:
    a = parse_vllm_metrics(exposition(1.0, with_spec=False))
    b = parse_vllm_metrics(exposition(2.0, with_spec=False))
    assert counter_deltas(a, b).tokens_per_round is None


def test_malformed_text() -> None:
    with pytest.raises(ValueError):
        parse_vllm_metrics("vllm:num_requests_running{engine=0 1\n")


def test_data_parallel_engines_give_gauges_per_engine() -> None:
    """Two engines behind one endpoint, each running 6 and queueing 1: the cost model's C is
    per engine (7, not 14), as K from cache_config_info is; counters still add up."""
    reg = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "", LABELS, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "", LABELS, registry=reg)
    usage = Gauge("vllm:kv_cache_usage_perc", "", LABELS, registry=reg)
    tokens = Counter("vllm:generation_tokens", "", LABELS, registry=reg)
    for engine, kv in (("0", 0.5), ("1", 0.3)):
        running.labels("qwen", engine).set(6)
        waiting.labels("qwen", engine).set(1)
        usage.labels("qwen", engine).set(kv)
        tokens.labels("qwen", engine).inc(100)
    snapshot = parse_vllm_metrics(generate_latest(reg).decode())
    assert snapshot.concurrency == 7 and snapshot.engines == 2
    assert snapshot.kv_cache_usage_perc == pytest.approx(0.4)
    assert snapshot.generation_tokens == 200


def test_non_finite_samples_read_as_not_reported() -> None:
    """A NaN or Inf sample is no measurement: kept, it reached rho and C as NaN, then the
    /admin/regime JSON (a 500) and the regime gauges."""
    page = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} NaN\n'
        'vllm:num_requests_running{engine="1"} 4\n'
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} +Inf\n'
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} NaN\n'
    )
    snap = parse_vllm_metrics(page)
    assert snap.num_requests_running == 4  # the engine that measured it
    assert snap.prefix_cache_queries is None and snap.prefix_cache_hits is None


def test_a_counter_back_after_a_scrape_without_it_is_not_a_delta() -> None:
    """A scrape that lacked the prefix-cache counters, the engine not restarted: the next
    one's totals are the engine's whole life, not the window's (rho read 0.1, not 1.0)."""
    before = VllmMetricsSnapshot(generation_tokens=5000, request_success=10)
    after = VllmMetricsSnapshot(
        generation_tokens=5020, request_success=12, prefix_cache_queries=1_000_100,
        prefix_cache_hits=100_100,
    )  # fmt: skip
    d = counter_deltas(before, after)
    assert d.prefix_cache_queries is None and d.rho is None
    assert d.generation_tokens == 20
    # After a restart every counter starts from 0: one the last scrape lacked counts whole.
    restarted = VllmMetricsSnapshot(generation_tokens=30, prefix_cache_queries=40)
    assert counter_deltas(before, restarted).prefix_cache_queries == 40


def test_a_replica_that_does_not_speculate_leaves_a_obs_alone() -> None:
    """Mid rolling restart one replica speculates (1000 generated, 500 accepted: A_obs 2)
    and the other does not yet (1000 generated). The tier's A_obs is the speculating one's;
    summed over both it read 2000 / 1500 = 1.33, as if half the rounds drafted nothing."""
    spec = counter_deltas(
        VllmMetricsSnapshot(
            generation_tokens=0, spec_decode_num_accepted_tokens=0, spec_decode_num_drafts=0
        ),
        VllmMetricsSnapshot(
            generation_tokens=1000, spec_decode_num_accepted_tokens=500, spec_decode_num_drafts=400
        ),
    )
    plain = counter_deltas(
        VllmMetricsSnapshot(generation_tokens=0), VllmMetricsSnapshot(generation_tokens=1000)
    )
    tier = spec + plain
    assert tier.tokens_per_round == pytest.approx(2.0)
    assert tier.coverage == pytest.approx(400 / 500)
    assert tier.generation_tokens == 2000  # L_out still counts every replica
    assert plain.tokens_per_round is None


def test_lengths_come_from_the_per_request_histograms() -> None:
    """vLLM counts prompt tokens at prefill and requests at their finish, so a window edge
    inside a running request skews the counters' ratio; its histograms of tokens per
    finished request move only at a finish. Here two requests of 300 prompt tokens finished
    in the window and a third of 3,000 was admitted but not finished: L_in is 300, where the
    counters said 3,600 / 2 = 1,800."""

    def page(
        prompt: float, finished: int, finished_prompt: float, output: float, generated: float
    ) -> str:
        reg = CollectorRegistry()
        Counter("vllm:prompt_tokens", "", LABELS, registry=reg).labels("qwen", "0").inc(prompt)
        Counter("vllm:generation_tokens", "", LABELS, registry=reg).labels("qwen", "0").inc(
            generated
        )
        success = Counter("vllm:request_success", "", [*LABELS, "finished_reason"], registry=reg)
        success.labels("qwen", "0", "stop").inc(finished)
        # Exported from the start, at 0, as vLLM does.
        prompts = Histogram("vllm:request_prompt_tokens", "", LABELS, registry=reg)
        outputs = Histogram("vllm:request_generation_tokens", "", LABELS, registry=reg)
        for _ in range(finished):
            prompts.labels("qwen", "0").observe(finished_prompt)
            outputs.labels("qwen", "0").observe(output / finished)
        prompts.labels("qwen", "0")
        outputs.labels("qwen", "0")
        return generate_latest(reg).decode()

    before = parse_vllm_metrics(page(0, 0, 0, 0, 40))
    # The running request has generated 40 tokens of its own: L_out is 50, not 140 / 2.
    after = parse_vllm_metrics(page(3600, 2, 300, 100, 180))
    window = counter_deltas(before, after)
    assert window.l_in == pytest.approx(300) and window.l_out == pytest.approx(50)
    # A window in which nothing finished has no lengths to tell (and divides by no zero).
    idle = counter_deltas(after, after)
    assert idle.l_in is None and idle.l_out is None
    assert window.prompt_tokens == 3600 and window.request_success == 2
    # A page without the histograms (another server) falls back to the counters.
    legacy = counter_deltas(
        VllmMetricsSnapshot(prompt_tokens=0, request_success=0, generation_tokens=0),
        VllmMetricsSnapshot(prompt_tokens=3600, request_success=2, generation_tokens=140),
    )
    assert legacy.l_in == pytest.approx(1800) and legacy.l_out == pytest.approx(70)
