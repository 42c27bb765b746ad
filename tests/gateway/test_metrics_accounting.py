"""What GatewayMetrics exports for known batches of RequestRecords: counts, escalations,
unmetered answers, tokens and cost, histogram buckets and shadow replay cost."""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gateway.stats import Attempt, Ladder, RequestRecord

LADDER: Final = Ladder(("cheap", "top"), (0.25, 1.0))


def _flushed(*records: RequestRecord) -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    for record in records:
        metrics.record(record)
    metrics.flush()
    return registry


def _record(**fields: Any) -> RequestRecord:
    base: dict[str, Any] = {"status": 200, "decided_tier": 0, "served_tier": 0, "reason": "router"}
    return RequestRecord("t", "chat", LADDER, **{**base, **fields})


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `name`, by its sorted labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def test_identical_requests_count_once_each() -> None:
    attempt = Attempt(0, "http://cheap:8000", "ok")
    registry = _flushed(*(_record(attempts=[attempt]) for _ in range(3)))
    labels = {"tenant": "t", "tier": "cheap", "endpoint": "chat", "status": "200"}
    assert registry.get_sample_value("tiergate_requests_total", labels) == 3
    attempts = {"tier": "cheap", "endpoint": "http://cheap:8000", "outcome": "ok"}
    assert registry.get_sample_value("tiergate_upstream_attempts_total", attempts) == 3


def test_requests_with_different_reasons_add_up_in_one_series() -> None:
    registry = _flushed(_record(reason="router"), _record(reason="default"))
    labels = {"tenant": "t", "tier": "cheap", "endpoint": "chat", "status": "200"}
    assert registry.get_sample_value("tiergate_requests_total", labels) == 2


def test_only_refused_requests_are_rejections() -> None:
    registry = _flushed(
        _record(),
        _record(status=429, served_tier=None, decided_tier=None, rejected="rate_limit_exceeded"),
    )
    assert _samples(registry, "tiergate_rejections_total") == {
        (("reason", "rate_limit_exceeded"), ("tenant", "t")): 1.0
    }


def test_a_decided_request_no_tier_served_counts_under_no_tier() -> None:
    registry = _flushed(_record(status=503, served_tier=None, reason="router"))
    labels = {"tenant": "t", "tier": "_none", "endpoint": "chat", "status": "503"}
    assert registry.get_sample_value("tiergate_requests_total", labels) == 1
    decided = {"tenant": "t", "tier": "cheap", "reason": "router"}
    assert registry.get_sample_value("tiergate_routing_decisions_total", decided) == 1


def test_an_escalation_is_counted_from_the_decided_to_the_serving_tier() -> None:
    """Why the decided tier did not serve: its own attempt's outcome."""
    attempts = [Attempt(0, "http://cheap:8000", "timeout"), Attempt(1, "http://top:8000", "ok")]
    registry = _flushed(_record(served_tier=1, attempts=attempts), _record())
    assert _samples(registry, "tiergate_escalations_total") == {
        (("from_tier", "cheap"), ("reason", "timeout"), ("tenant", "t"), ("to_tier", "top")): 1.0
    }


def test_a_client_that_left_is_a_disconnect_not_a_stream_error() -> None:
    registry = _flushed(_record(status=499, client_disconnected=True, stream=True))
    disconnects = _samples(registry, "tiergate_client_disconnects_total")
    assert disconnects == {(("tenant", "t"), ("tier", "cheap")): 1.0}
    assert _samples(registry, "tiergate_stream_errors_total") == {}


def test_a_stream_cut_after_its_first_byte_is_a_stream_error_not_a_disconnect() -> None:
    registry = _flushed(_record(error_after_first_byte=True, stream=True))
    errors = _samples(registry, "tiergate_stream_errors_total")
    assert errors == {(("tenant", "t"), ("tier", "cheap")): 1.0}
    assert _samples(registry, "tiergate_client_disconnects_total") == {}


def test_a_json_request_left_waiting_is_not_unmetered() -> None:
    """No tier served it: there was nothing to meter."""
    registry = _flushed(_record(status=499, served_tier=None, client_disconnected=True))
    assert _samples(registry, "tiergate_unmetered_requests_total") == {}


def test_only_answers_without_usage_are_unmetered() -> None:
    registry = _flushed(
        _record(prompt_tokens=5, completion_tokens=3),
        _record(),  # a 200 without usage
        _record(status=499, client_disconnected=True),  # a stream its client left
        _record(prompt_tokens=5, completion_tokens=0),  # usage that reports no output
    )
    assert _samples(registry, "tiergate_unmetered_requests_total") == {
        (("tenant", "t"), ("tier", "cheap")): 2.0
    }


def test_tokens_and_cost_are_counted_per_kind_at_the_serving_tiers_cost() -> None:
    attempts = [Attempt(0, "http://cheap:8000", "status_5xx"), Attempt(1, "http://top:8000", "ok")]
    registry = _flushed(
        _record(prompt_tokens=7, completion_tokens=0),
        _record(served_tier=1, attempts=attempts, prompt_tokens=6, completion_tokens=4),
    )
    cheap, top = {"tenant": "t", "tier": "cheap"}, {"tenant": "t", "tier": "top"}
    assert registry.get_sample_value("tiergate_prompt_tokens_total", cheap) == 7
    assert registry.get_sample_value("tiergate_completion_tokens_total", cheap) == 0
    assert registry.get_sample_value("tiergate_estimated_cost_total", cheap) == 7 * 0.25
    assert registry.get_sample_value("tiergate_prompt_tokens_total", top) == 6
    assert registry.get_sample_value("tiergate_completion_tokens_total", top) == 4
    assert registry.get_sample_value("tiergate_estimated_cost_total", top) == 10 * 1.0


def test_a_duration_on_a_bucket_bound_falls_in_that_bucket() -> None:
    """Prometheus buckets are `le`: 0.5 s is within the 0.5 bucket."""
    registry = _flushed(_record(duration_s=0.5))
    labels = {"tenant": "t", "tier": "cheap", "le": "0.5"}
    assert registry.get_sample_value("tiergate_request_duration_seconds_bucket", labels) == 1
    below = {"tenant": "t", "tier": "cheap", "le": "0.25"}
    assert registry.get_sample_value("tiergate_request_duration_seconds_bucket", below) == 0


def _shadow(routed: bool, floor: str | None) -> CollectorRegistry:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    if floor is not None:
        metrics.uniform_floor_tier["t"] = floor
    metrics.record_shadow_cost("t", 8.0, routed=routed)
    return registry


def test_a_routed_requests_replay_is_overspend_against_the_tenants_baselines() -> None:
    registry = _shadow(routed=True, floor="cheap")
    assert registry.get_sample_value("tiergate_shadow_cost_total", {"tenant": "t"}) == 8
    assert _samples(registry, "tiergate_estimated_overspend_total") == {
        (("baseline", "top_tier"), ("tenant", "t")): 8.0,
        (("baseline", "uniform_floor"), ("tenant", "t")): 8.0,
    }
    # Without a floor (no alpha) there is no uniform_floor baseline to overspend against.
    without_floor = _shadow(routed=True, floor=None)
    assert _samples(without_floor, "tiergate_estimated_overspend_total") == {
        (("baseline", "top_tier"), ("tenant", "t")): 8.0
    }


def test_a_pinned_requests_replay_is_shadow_cost_only() -> None:
    registry = _shadow(routed=False, floor="cheap")
    assert registry.get_sample_value("tiergate_shadow_cost_total", {"tenant": "t"}) == 8
    assert _samples(registry, "tiergate_estimated_overspend_total") == {}


def test_time_to_first_token_is_observed_for_streams_only() -> None:
    registry = _flushed(_record(stream=True, ttft_s=0.2), _record(status=201))
    streamed = {"tenant": "t", "tier": "cheap"}
    assert registry.get_sample_value("tiergate_time_to_first_token_seconds_count", streamed) == 1
    assert registry.get_sample_value("tiergate_time_to_first_token_seconds_sum", streamed) == 0.2


def test_a_request_served_at_the_baselines_cost_saved_nothing_and_overspent_nothing() -> None:
    """Its savings series reads 0 (a share of the baseline cost that is 0%, not no data)."""
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.tenant_top_tier["t"] = "top"
    metrics.record(_record(served_tier=1, decided_tier=1, prompt_tokens=6, completion_tokens=4))
    metrics.flush()
    labels = {"tenant": "t", "baseline": "top_tier"}
    assert registry.get_sample_value("tiergate_estimated_savings_total", labels) == 0
    assert registry.get_sample_value("tiergate_estimated_overspend_total", labels) is None
    assert registry.get_sample_value("tiergate_estimated_baseline_cost_total", labels) == 10
