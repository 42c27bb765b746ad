"""The rolling-window RegimeTracker."""

from __future__ import annotations

import random

import pytest

from gateway.observer.acceptance import inverse_accepted_per_round
from gateway.observer.ngram_replay import estimate_r
from gateway.observer.prefix_replay import estimate_rho
from gateway.observer.regime import (
    OTHER_TENANTS,
    RegimeTracker,
    TrackerConfig,
    per_engine_concurrency,
)
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


@pytest.mark.parametrize("bucket_s", [0.1, 0.7, 1.3, 3.3, 0.01])
def test_a_bucket_width_not_exact_in_binary_credits_every_second(bucket_s: float) -> None:
    """(index + 1) * bucket_s can round down to the time it starts from: a walk by time then
    never moved on, and the event loop hung (0.1: from 4.25 to 4.35). Whatever the width,
    the level is credited for exactly the time it was held."""
    tr = RegimeTracker(TrackerConfig(window_s=300 * bucket_s, bucket_s=bucket_s))
    rng = random.Random(5)
    t = 4.25 if bucket_s == 0.1 else 41_400.0 + rng.random()
    tr.request_started("t", "a", t)
    held = 0.0
    for _ in range(2000):
        step = rng.choice([0.1, bucket_s, 2 * bucket_s, 0.03 * bucket_s])
        tr.request_finished("t", "a", t + step)
        tr.request_started("t", "a", t + step)
        t, held = t + step, held + step
    series = tr._series[("t", "*")]
    credited = sum(sum(b.level_seconds.values()) for b in series._buckets)
    oldest = series._buckets[0].index * bucket_s
    assert credited == pytest.approx(t - max(oldest, t - held), rel=1e-6)


def test_scrapes_between_request_events_keep_the_window_exact() -> None:
    # Ten requests in flight from t=0 to t=80, one until t=130; a scrape every 15 s opens
    # buckets between the request events. The window is whole buckets, [75, 130): level 10
    # for 5 s, then 1 for 50 s. The time since the last request event must not be poured
    # into the bucket a scrape opened (which counted 60 s of level 10 here).
    tr = RegimeTracker(TrackerConfig(window_s=60, bucket_s=5))
    for _ in range(10):
        tr.request_started("t", "a", 0.0)
    scrape = 15.0
    for t in (80.0, 130.0):
        while scrape < t:
            tr.engine_snapshot("t", scrape, VllmMetricsSnapshot(), endpoint="e")
            scrape += 15.0
        if t == 80.0:
            for _ in range(9):
                tr.request_finished("t", "a", t)
    assert tr.report("t", 130.0).concurrency.mean == pytest.approx((10 * 5 + 1 * 50) / 55)


def test_a_sample_taken_before_queued_request_events_loses_no_in_flight_time() -> None:
    """The observer drains request events in batches, while a sample is recorded when its
    tokenize call returns: a sample at t=10 can come before the events of a request that ran
    from 9 to 9.5. Had the sample moved the clock to 10, that request's time was lost (and the
    tier read as idle: "no traffic in the window")."""
    tr = RegimeTracker(TrackerConfig(window_s=60, bucket_s=5))
    tr.request_started("t", "a", 0.0)
    tr.request_finished("t", "a", 1.0)
    tr.prompt_sampled("t", "a", 10.0, list(range(40)))
    tr.request_started("t", "a", 9.0)
    tr.request_finished("t", "a", 9.5)
    assert tr.report("t", 20.0).concurrency.mean == pytest.approx(1.5 / 20)


def test_the_gateways_concurrency_is_split_over_data_parallel_engines() -> None:
    """Twelve requests in flight to one endpoint that runs two engines: C is 6 per engine,
    as K (per engine) wants it, not 12."""
    tr = RegimeTracker(TrackerConfig(window_s=60, bucket_s=5))
    tr.configure_tier("t", endpoints=1)
    tr.engine_snapshot("t", 0.0, VllmMetricsSnapshot(engines=2), endpoint="e")
    for _ in range(12):
        tr.request_started("t", "a", 0.0)
    conc = tr.report("t", 10.0).concurrency
    assert conc.endpoints == 2
    assert per_engine_concurrency(conc.mean, conc.engine_mean, conc.endpoints) == 6


def test_rho_matches_batch_estimator_and_capacity_from_engine() -> None:
    rng = random.Random(1)
    shared = [rng.randrange(500) for _ in range(256)]
    prompts = [
        shared[: rng.randrange(16, 256)] + [rng.randrange(500) for _ in range(64)]
        for _ in range(40)
    ]
    tr = RegimeTracker(TrackerConfig(window_s=1000, bucket_s=10))
    tr.engine_snapshot(
        "t",
        0.0,
        VllmMetricsSnapshot(cache_config=CacheConfigInfo(30, 16, True, 0.9, "auto")),
        endpoint="a",
    )
    for i, p in enumerate(prompts):
        tr.prompt_sampled("t", "a" if i % 2 else "b", float(i), p)
    rho = tr.report("t", 50.0).rho
    want = estimate_rho(prompts, 16, 30)
    assert rho.unbounded == pytest.approx(want["unbounded"])
    assert rho.lru == pytest.approx(want["lru"]) and rho.capacity_blocks == 30
    assert rho.engine is None  # no counter deltas yet


def test_a_conversations_next_turn_hits_the_previous_answer() -> None:
    """vLLM caches the full blocks of an answer too: the next turn, whose prompt holds the
    previous prompt and answer, hits them (prompt blocks alone gave 1 block of 4, not 3)."""
    tr = RegimeTracker(TrackerConfig(window_s=1000, bucket_s=10))
    first = list(range(100, 132))  # 2 blocks of 16
    answer = list(range(200, 220))  # completes a third block (its last token is not cached)
    tr.prompt_sampled("t", "a", 0.0, first)
    tr.completion_sampled("t", "a", 1.0, first, answer)
    second = [*first, *answer, *range(300, 316)]  # 68 tokens: 4 full blocks
    tr.prompt_sampled("t", "a", 2.0, second)
    rho = tr.report("t", 3.0).rho
    assert rho.unbounded == pytest.approx((0 + 48) / (32 + 68))


def test_prompts_in_other_cache_namespaces_do_not_hit_each_other() -> None:
    """As vLLM keys blocks by cache_salt (COST_MODEL.md c.1), so does the replay: tenant a's
    prompt, then b's identical one in its own namespace, hit nothing; a's again hits, and
    so does its answer's block, cached in a's namespace."""
    tr = RegimeTracker(TrackerConfig(window_s=1000, bucket_s=10))
    prompt = list(range(100, 132))  # 2 blocks of 16
    answer = list(range(200, 217))  # completes a third block
    tr.prompt_sampled("t", "a", 0.0, prompt, cache_salt="a")
    tr.completion_sampled("t", "a", 0.5, prompt, answer, cache_salt="a")
    tr.prompt_sampled("t", "b", 1.0, prompt, cache_salt="b")
    tr.prompt_sampled("t", "c", 1.5, [*prompt, *answer])  # the shared namespace
    rho = tr.report("t", 2.0).rho
    assert rho.unbounded == 0.0 and rho.lru == 0.0  # both replays key blocks by namespace
    tr.prompt_sampled("t", "a", 2.5, [*prompt, *answer, 1])
    rho = tr.report("t", 3.0, tenant="a").rho
    assert rho.unbounded == rho.lru == pytest.approx(48 / (32 + 50))


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
    tr.engine_snapshot("t", 1.0, first, endpoint="a")
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
        endpoint="a",
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


def _scrape(
    queries: float, hits: float, generated: float, accepted: float, done: float
) -> VllmMetricsSnapshot:
    return VllmMetricsSnapshot(
        num_requests_running=10.0,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        generation_tokens=generated,
        spec_decode_num_accepted_tokens=accepted,
        spec_decode_num_drafts=0.0,
        prompt_tokens=queries,
        request_success=done,
    )


def test_engine_counters_are_diffed_per_replica_and_summed() -> None:
    """Two replicas of one tier, scraped in turn: each is diffed against its own previous
    scrape. Diffed against each other, B - A read as huge deltas and A < B as restarts
    (engine rho 0.899 instead of 0.5)."""
    tr = RegimeTracker()
    replicas = {
        "http://a/v1": [1_000_000.0, 100_000.0, 50_000.0, 10_000.0, 100.0],
        "http://b/v1": [2_000_000.0, 1_600_000.0, 90_000.0, 80_000.0, 900.0],
    }
    for k in range(5):
        for url, counters in replicas.items():
            if k:  # per scrape and replica: 1000 queries, 500 hits, 300 tokens / 100 accepted
                for i, step in enumerate((1000.0, 500.0, 300.0, 100.0, 2.0)):
                    counters[i] += step
            tr.engine_snapshot("t", 15.0 * k, _scrape(*counters), endpoint=url)
    report = tr.report("t", 70.0)
    assert report.rho.engine == pytest.approx(0.5)
    assert report.r.a_obs == pytest.approx(300.0 / 200.0)
    assert report.l_in == pytest.approx(500.0) and report.l_out == pytest.approx(150.0)
    assert report.concurrency.engine_mean == pytest.approx(10.0)


def test_a_replica_that_returns_starts_afresh() -> None:
    tr = RegimeTracker()
    tr.engine_snapshot("t", 0.0, _scrape(0.0, 0.0, 0.0, 0.0, 0.0), endpoint="a")
    tr.retain_endpoints("t", [])  # removed by a reload
    tr.engine_snapshot("t", 10.0, _scrape(1e6, 9e5, 0.0, 0.0, 0.0), endpoint="a")
    tr.engine_snapshot("t", 20.0, _scrape(1e6 + 100, 9e5 + 10, 0.0, 0.0, 0.0), endpoint="a")
    assert tr.report("t", 30.0).rho.engine == pytest.approx(0.1)


def test_the_planners_c_is_per_engine() -> None:
    """c.1: C is in-flight requests per backend (K and B_eff are per engine). 20 requests in
    flight over 2 replicas are 10 per engine, not 20."""
    tr = RegimeTracker()
    tr.configure_tier("t", endpoints=2)
    for _ in range(20):
        tr.request_started("t", "a", 0.0)
    conc = tr.report("t", 100.0).concurrency
    assert conc.mean == pytest.approx(20.0) and conc.endpoints == 2
    assert per_engine_concurrency(conc.mean, conc.engine_mean, conc.endpoints) == 10.0
    # The engines' own count wins when larger (other clients), and stands alone when the
    # gateway saw nothing.
    assert per_engine_concurrency(20.0, 12.0, 2) == 12.0
    assert per_engine_concurrency(None, 40.0, 2) == 40.0
    assert per_engine_concurrency(None, None, 2) is None


def test_the_peak_is_a_level_held_for_some_time() -> None:
    """A second request that starts and ends at the same instant adds no in-flight time:
    the peak is 1 (held for 3 s), not 2 (held for none)."""
    tr = RegimeTracker(TrackerConfig(window_s=60, bucket_s=10))
    tr.request_started("t", "a", 1.0)
    tr.request_started("t", "a", 2.0)
    tr.request_finished("t", "a", 2.0)
    tr.request_finished("t", "a", 4.0)
    assert tr.report("t", 10.0).concurrency.max == 1.0


def test_a_late_event_in_the_same_bucket_takes_no_time_back() -> None:
    """An event stamped before the last one (queued from another task) must not credit
    negative seconds: [1, 3] and [3, 5] count 2 s each at level 1, nothing else."""
    tr = RegimeTracker(TrackerConfig(window_s=60, bucket_s=10))
    tr.request_started("t", "a", 1.0)
    tr.request_started("t", "a", 3.0)
    tr.request_finished("t", "a", 2.0)  # late
    tr.request_finished("t", "a", 5.0)
    series = tr._series[("t", "*")]
    seconds = series.window(10.0)[0].level_seconds
    assert seconds == {1: pytest.approx(4.0)}


def test_samples_in_one_bucket_share_it() -> None:
    """Many samples within one bucket's time add to that bucket, not one bucket each."""
    cfg = TrackerConfig(window_s=10, bucket_s=1)
    tr = RegimeTracker(cfg)
    for i in range(100):
        tr.prompt_sampled("t", "a", 5.0 + i / 1000, [1, 2, 3, 4] * 8)
    series = tr._series[("t", "*")]
    assert len(series._buckets) == 1 and series._buckets[0].prompts == 100
