"""The rolling-window RegimeTracker."""

from __future__ import annotations

import random

import pytest

from gateway.observer.acceptance import inverse_accepted_per_round
from gateway.observer.ngram_replay import estimate_r
from gateway.observer.prefix_replay import estimate_rho
from gateway.observer.regime import OTHER_TENANTS, RegimeTracker, TrackerConfig
from gateway.observer.vllm_metrics import CacheConfigInfo, VllmMetricsSnapshot


def test_time_weighted_concurrency_per_tenant_and_tier() -> None:
    tr = RegimeTracker(TrackerConfig(window_s=60, bucket_s=1))
    for _ in range(4):
        tr.request_started("nvfp4", "a", 0.0)
    for _ in range(2):
        tr.request_started("nvfp4", "b", 0.0)
    tr.request_finished("nvfp4", "a", 15.0)
    tier = tr.report("nvfp4", 30.0).concurrency
    assert (tier.mean, tier.p50, tier.p95, tier.max) == (5.5, 5.0, 6.0, 6.0)
    assert tr.report("nvfp4", 30.0, "a").concurrency.mean == pytest.approx(3.5)
    assert tr.report("nvfp4", 30.0, "b").concurrency.mean == pytest.approx(2.0)
    assert tr.tenants("nvfp4") == ["a", "b"] and tr.tiers() == ["nvfp4"]


def test_window_rolls_and_memory_is_bounded() -> None:
    cfg = TrackerConfig(window_s=10, bucket_s=1)
    tr = RegimeTracker(cfg)
    tr.request_started("t", "a", 0.0)
    tr.request_finished("t", "a", 5.0)
    tr.request_started("t", "a", 100.0)
    # Only [90, 100]: idle, then the new request.
    assert tr.report("t", 105.0).concurrency.mean == pytest.approx(0.5, abs=0.1)
    for i in range(10_000):
        tr.request_started("t", "a", 200.0 + i * 0.5)
        tr.request_finished("t", "a", 200.0 + i * 0.5 + 0.1)
    series = tr._series[("t", "*")]
    assert len(series._buckets) <= cfg.window_s / cfg.bucket_s + 1


def test_concurrency_mean_is_the_exact_time_weighted_level() -> None:
    # Random in-order arrivals and departures: some in one bucket, some across buckets, idle
    # gaps longer than the window. The window is whole buckets, so over it the tracker's mean
    # is exactly the time-weighted level.
    rng = random.Random(7)
    cfg = TrackerConfig(window_s=20, bucket_s=2)
    for trial in range(30):
        tr = RegimeTracker(cfg)
        t, level, changes = 0.0, 0, [(0.0, 0)]
        tr.request_started("t", "a", 0.0)
        tr.request_finished("t", "a", 0.0)
        for _ in range(200):
            t += rng.choice([0.01, 0.3, 1.7, 2.5]) if rng.random() < 0.97 else 45.0
            if level and rng.random() < 0.5:
                tr.request_finished("t", "a", t)
                level -= 1
            else:
                tr.request_started("t", "a", t)
                level += 1
            changes.append((t, level))
        now = t + rng.random() * 3
        first = (int(now // cfg.bucket_s) - int(cfg.window_s / cfg.bucket_s) + 1) * cfg.bucket_s
        area = 0.0
        for (start, lvl), (end, _) in zip(changes, [*changes[1:], (now, 0)], strict=True):
            area += lvl * max(0.0, min(end, now) - max(start, first))
        got = tr.report("t", now).concurrency.mean
        assert got == pytest.approx(area / (now - first), rel=1e-9, abs=1e-9), trial


def test_rho_matches_batch_estimator_and_capacity_from_engine() -> None:
    rng = random.Random(1)
    shared = [rng.randrange(500) for _ in range(256)]
    prompts = [
        shared[: rng.randrange(16, 256)] + [rng.randrange(500) for _ in range(64)]
        for _ in range(40)
    ]
    tr = RegimeTracker(TrackerConfig(window_s=1000, bucket_s=10))
    tr.engine_snapshot(
        "t", 0.0, VllmMetricsSnapshot(cache_config=CacheConfigInfo(30, 16, True, 0.9, "auto"))
    )
    for i, p in enumerate(prompts):
        tr.prompt_sampled("t", "a" if i % 2 else "b", float(i), p)
    rho = tr.report("t", 50.0).rho
    want = estimate_rho(prompts, 16, 30)
    assert rho.unbounded == pytest.approx(want["unbounded"])
    assert rho.lru == pytest.approx(want["lru"]) and rho.capacity_blocks == 30
    assert rho.engine is None  # no counter deltas yet


def test_r_from_replay_and_engine() -> None:
    rng = random.Random(2)
    pairs = []
    for _ in range(10):
        prompt = [rng.randrange(30) for _ in range(100)]
        start = rng.randrange(60)
        pairs.append((prompt, prompt[start : start + 30] + [rng.randrange(30) for _ in range(10)]))
    tr = RegimeTracker()
    tr.configure_tier("t", precision="nvfp4", eta=0.698)
    for i, (p, c) in enumerate(pairs):
        tr.completion_sampled("t", "a", float(i), p, c)
    first = VllmMetricsSnapshot(
        generation_tokens=0,
        spec_decode_num_accepted_tokens=0,
        spec_decode_num_drafts=0,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
    )
    tr.engine_snapshot("t", 1.0, first)
    tr.engine_snapshot(
        "t",
        2.0,
        VllmMetricsSnapshot(
            generation_tokens=3000,
            spec_decode_num_accepted_tokens=1000,
            prefix_cache_queries=1000,
            prefix_cache_hits=250,
            spec_decode_num_drafts=900,
        ),
    )
    report = tr.report("t", 20.0)
    assert report.r.r_iid == pytest.approx(estimate_r(pairs, 2, 4, 4)["r_iid"])
    assert report.r.a_obs == pytest.approx(1.5)
    assert report.r.r_engine == pytest.approx(inverse_accepted_per_round(1.5, 4) / 0.698)
    assert report.rho.engine == pytest.approx(0.25)
    assert report.l_out == pytest.approx(40.0)
    doc = tr.report_all(20.0)["tiers"]["t"]
    assert doc["precision"] == "nvfp4"
    assert set(doc) >= {"concurrency", "rho", "r"}
    assert doc["r"]["r_iid"] == report.r.r_iid
    # Engine counters are tier-wide, so a tenant report carries none.
    assert tr.report("t", 20.0, "a").r.r_engine is None


def test_tenants_fold_past_the_cap() -> None:
    tr = RegimeTracker(TrackerConfig(max_tenants_per_tier=2))
    for name in ("a", "b", "c", "d"):
        tr.request_started("t", name, 0.0)
    assert tr.tenants("t") == ["a", "b", OTHER_TENANTS]
    assert tr.report("t", 10.0, "c").concurrency.mean == pytest.approx(2.0)
    for i in range(1000):  # many folded tenants: per-tenant state stays bounded
        tr.request_started("t", f"extra-{i}", 1.0)
        tr.request_finished("t", f"extra-{i}", 1.5)
    assert len(tr._series) == 4 and len(tr._pairs) == 2
    assert tr.report("t", 10.0, OTHER_TENANTS).concurrency.mean == pytest.approx(2.0)


def test_empty_report() -> None:
    report = RegimeTracker().report("t", 0.0)
    assert report.concurrency.mean is None and report.rho.unbounded is None
    assert report.r.r_iid is None and report.r.rounds == 0


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        TrackerConfig(window_s=1, bucket_s=2)
