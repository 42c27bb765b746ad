"""The sampler's replay rules without upstreams: allowed tiers, budget, bounds, log lines."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from gateway.backends.tier import TierBackend, build_tiers
from gateway.config import Settings, default_settings, parse_settings
from gateway.metrics import GatewayMetrics
from gateway.shadow.sampler import (
    ShadowSampler,
    kept_request,
    pick_below,
    replay_budget,
    replay_id_header,
    skip_reason,
)
from gateway.stats import CompletedExchange
from router_models.features import named_dense_features

TIERS = ("nvfp4", "w4a16", "bf16")


def settings(*, shadow: dict[str, Any] | None = None, **tenant: Any) -> Settings:
    data = default_settings().model_dump(mode="json")
    data["shadow"] = {"rate": 1.0, "explore_rate": 1.0, "assume_deterministic": True} | (
        shadow or {}
    )
    data["tenants"][0] |= tenant
    for tier, slots in zip(data["tiers"], (1000, 1000, 10), strict=True):
        tier["max_inflight_per_endpoint"] = slots  # the top tier has the fewest slots
    return parse_settings(data)


def exchange(tier: int, request: dict[str, Any] | None = None) -> CompletedExchange:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
    return CompletedExchange(
        tenant="default",
        kind="chat",
        tier=TIERS[tier],
        tier_index=tier,
        request=request or {"messages": [{"role": "user", "content": "hi"}]},
        body=orjson.dumps(body),
        probability=None,
        probabilities=None,
        reason="test",
        score=0.5,
    )


class Harness:
    """A sampler whose replays are recorded instead of sent."""

    def __init__(self, config: Settings, draw: float = 0.0) -> None:
        self.registry = CollectorRegistry()
        self.tiers = build_tiers(config)
        self.sampler = ShadowSampler(
            config,
            GatewayMetrics(self.registry),
            lambda: self.tiers,
            rng=lambda: draw,
            features=named_dense_features,
        )
        self.replayed: list[str] = []
        self.sampler._replay = self._replay  # type: ignore[method-assign]

    async def _replay(self, target: TierBackend, exchange: CompletedExchange) -> str | None:
        self.replayed.append(target.name)
        return "ok"

    def evaluate(self, served: CompletedExchange) -> bool | None:
        return asyncio.run(self.sampler.evaluate(served))

    def count(self, tier: str, outcome: str) -> float:
        labels = {"tenant": "default", "tier": tier, "outcome": outcome}
        return self.registry.get_sample_value("tiergate_shadow_requests_total", labels) or 0.0


@pytest.mark.parametrize("draw", [0.0, 0.99])
def test_exploration_stays_within_the_allowed_tiers(draw: float) -> None:
    harness = Harness(settings(allowed_tiers=["w4a16", "bf16"]), draw)
    assert harness.evaluate(exchange(2)) is True  # a top-tier answer explores w4a16 only
    assert harness.evaluate(exchange(1)) is True  # reference bf16; nvfp4 is not explored
    assert harness.replayed == ["w4a16", "bf16"]


def test_no_replay_when_the_reference_tier_is_not_allowed() -> None:
    harness = Harness(settings(allowed_tiers=["nvfp4", "w4a16"]))
    assert not harness.sampler.wants_capture("default", 0, {}, "chat")
    assert harness.count("nvfp4", "skipped_tier_not_allowed") == 1
    assert harness.evaluate(exchange(1)) is None  # captured before a reload, say
    assert harness.replayed == []
    assert harness.count("w4a16", "skipped_tier_not_allowed") == 1


def test_echoed_completions_are_not_labelled() -> None:
    """An echoed answer starts with the prompt (and is only the prompt when a harness scores
    it): judged, every tier would look adequate."""
    harness = Harness(settings())
    echoed = exchange(0, {"prompt": "2 + 2 =", "echo": True, "max_tokens": 0})
    assert harness.evaluate(echoed) is None
    assert harness.replayed == []
    assert harness.count("nvfp4", "skipped_echo") == 1
    assert harness.evaluate(exchange(0, {"prompt": "2 + 2 =", "echo": False})) is True


def test_an_answer_of_several_choices_is_not_labelled() -> None:
    """The judges compare one answer with one reference: labelled from its first choice, a
    tier whose second answer differs was called adequate."""
    harness = Harness(settings())
    two = dataclasses.replace(
        exchange(0, {"messages": [{"role": "user", "content": "2+2?"}], "n": 2, "seed": 1}),
        body=orjson.dumps(
            {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}},
                    {"index": 1, "message": {"role": "assistant", "content": "5"}},
                ]
            }
        ),
    )
    assert harness.evaluate(two) is None
    assert harness.replayed == []
    assert harness.count("nvfp4", "skipped_choices") == 1


def test_pick_below_draws_among_allowed_tiers_only() -> None:
    assert pick_below(2, frozenset({0, 1, 2}), 0.6) == 1
    assert pick_below(2, frozenset({1, 2}), 0.0) == 1
    assert pick_below(1, frozenset({1, 2}), 0.5) is None
    assert pick_below(3, frozenset({0, 2}), 0.999) == 2


def test_a_zero_budget_share_means_no_replays() -> None:
    assert replay_budget(0.0, 512) == 0
    assert replay_budget(0.1, 4) == 1  # a positive share allows at least one
    assert replay_budget(0.1, 512) == 51
    harness = Harness(settings(shadow={"budget_share": 0.0}))
    assert not harness.sampler.wants_capture("default", 0, {}, "chat")
    assert harness.evaluate(exchange(0)) is None
    assert harness.replayed == [] and harness.count("nvfp4", "skipped_budget") == 1


def test_the_budget_is_a_share_of_the_top_tiers_slots() -> None:
    # 10% of bf16's 10 slots is one replay, although nvfp4 has 1000 slots.
    harness = Harness(settings(shadow={"budget_share": 0.1}))
    harness.sampler.inflight = 1
    assert harness.evaluate(exchange(2)) is None
    assert harness.replayed == [] and harness.count("nvfp4", "skipped_budget") == 1


def test_plugin_judges_let_stochastic_pairs_be_replayed() -> None:
    common: dict[str, Any] = {"target_busy": False, "inflight": 0, "budget": 1}
    judges = ["normalized", "os.path:samefile"]
    assert skip_reason(deterministic=False, judges=judges, **common) is None
    assert skip_reason(deterministic=False, judges=["normalized"], **common) == "not_deterministic"


def test_a_reload_applies_new_queue_and_concurrency_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = Harness(settings(shadow={"max_concurrency": 1, "queue_size": 10}))
    sampler = harness.sampler
    running: list[CompletedExchange] = []
    release = asyncio.Event()

    async def evaluate(served: CompletedExchange) -> bool | None:
        running.append(served)
        await release.wait()
        return True

    monkeypatch.setattr(sampler, "evaluate", evaluate)

    async def scenario() -> None:
        tasks = sampler.start()
        for _ in range(4):
            sampler.exchange_done(exchange(0))
        await asyncio.sleep(0.01)
        assert len(running) == 1  # max_concurrency 1
        sampler.configure(settings(shadow={"max_concurrency": 3, "queue_size": 3}), None)
        sampler.exchange_done(exchange(0))  # 3 waiting: the new queue_size refuses it
        release.set()
        await asyncio.sleep(0.01)
        assert len(running) == 4  # the other three ran together, under the new bound
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
    assert harness.count("nvfp4", "skipped_queue_full") == 1  # not the budget: the queue


def test_waiting_exchanges_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 waiting exchanges of 4 MiB requests held a gigabyte behind a busy top tier: the
    queue counted exchanges only. One past the byte bound is a skipped_queue_full."""
    harness = Harness(settings(shadow={"max_concurrency": 1, "queue_size": 100}))
    sampler = harness.sampler
    release = asyncio.Event()

    async def evaluate(served: CompletedExchange) -> bool | None:
        await release.wait()
        return True

    monkeypatch.setattr(sampler, "evaluate", evaluate)
    big = dataclasses.replace(exchange(0), request_bytes=6000)

    async def scenario() -> None:
        tasks = sampler.start()
        assert sampler._queue is not None
        sampler._queue.max_bytes = 10_000
        sampler.exchange_done(big)  # taken at once: evaluating, not waiting
        await asyncio.sleep(0.01)
        sampler.exchange_done(big)
        sampler.exchange_done(big)  # 12,000 bytes waiting: refused
        release.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
    assert harness.count("nvfp4", "skipped_queue_full") == 1


def test_kept_text_lines_keep_every_field_the_features_read() -> None:
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "Return JSON for 2+2."}],
        "tools": [{"type": "function", "function": {"name": "add"}}],
        "response_format": {"type": "json_object"},
        "max_completion_tokens": 64,
        "temperature": 0.7,
        "n": 2,
        "user": "alice@example.com",
        "metadata": {"secret": "x"},
    }
    kept = kept_request(request)
    assert named_dense_features(kept) == named_dense_features(request)
    assert "user" not in kept and "metadata" not in kept and "model" not in kept
    assert kept_request({"prompt": "hi", "max_tokens": 5}) == {"prompt": "hi", "max_tokens": 5}

    harness = Harness(settings(shadow_keep_text=True))
    line = harness.sampler._line(exchange(0, request), "nvfp4", True, "exact", None)
    assert line["request"] == kept


@pytest.mark.parametrize("keep_text", [True, False])
def test_a_label_line_describes_the_body_the_engine_read(keep_text: bool) -> None:
    """A completions body's stray `messages` (vLLM ignores it) must not reach the label log,
    where training reads the body's own fields and would take it for a chat."""
    stray = {"prompt": "Once upon a time", "messages": [{"role": "user", "content": "2+2?"}]}
    completion = dataclasses.replace(exchange(0, stray), kind="completions")
    harness = Harness(settings(shadow_keep_text=keep_text))
    line = harness.sampler._line(completion, "nvfp4", True, "exact", None)
    if keep_text:
        assert line["request"] == {"prompt": "Once upon a time"}
    else:
        assert line["features"] == named_dense_features({"prompt": "Once upon a time"})
        assert line["features"] != named_dense_features(stray)


def test_a_replay_carries_the_clients_request_id_marked_as_a_replay() -> None:
    """The engine logs the replay beside the original; never the same id (vLLM aborts by id)."""
    original = dataclasses.replace(exchange(0), request_id="req_0123456789ab000000000007")
    assert replay_id_header(original) == b"x-request-id: req_0123456789ab000000000007-shadow\r\n"
    assert replay_id_header(exchange(0)) == b""  # no id known: the engine makes its own


def test_a_reload_applies_new_drift_settings_to_the_kept_monitor() -> None:
    harness = Harness(settings(shadow={"drift_margin": 0.1, "min_labels": 5}))
    sampler = harness.sampler
    monitor = sampler.monitor
    for _ in range(5):
        sampler._record(exchange(0), 0, False, "exact")
    sampler.configure(settings(shadow={"drift_margin": 0.3, "min_labels": 50, "window": 10}), None)
    assert sampler.monitor is monitor and monitor.labels("default", "nvfp4")  # labels kept
    assert (monitor.margin, monitor.min_labels, monitor.window) == (0.3, 50, 10)


def test_a_reload_that_widens_the_drift_margin_clears_the_drift_gauge() -> None:
    """Observed 0.6 against predicted 0.8 drifts at a margin of 0.1, not at 0.3: the gauge
    (and the alert on it) follows the reload, not the tier's next label."""
    harness = Harness(settings(shadow={"drift_margin": 0.1, "min_labels": 5}))
    sampler = harness.sampler
    predicted = dataclasses.replace(exchange(0), probability=0.8)
    for i in range(10):
        sampler._record(predicted, 0, i < 6, "exact")
    labels = {"tenant": "default", "tier": "nvfp4"}
    assert harness.registry.get_sample_value("tiergate_calibration_drift", labels) == 1
    sampler.configure(settings(shadow={"drift_margin": 0.3, "min_labels": 5}), None)
    assert harness.registry.get_sample_value("tiergate_calibration_drift", labels) == 0


def test_a_reload_that_raises_min_labels_past_those_held_drops_the_calibration_error() -> None:
    """Ten labels, then min_labels 20: the monitor has no ECE, and the gauge must not keep
    the old one (its alert would hold on a figure no longer computed)."""
    harness = Harness(settings(shadow={"min_labels": 5}))
    sampler = harness.sampler
    predicted = dataclasses.replace(exchange(0), probability=0.8)
    for i in range(10):
        sampler._record(predicted, 0, i < 6, "exact")
    labels = {"tenant": "default", "tier": "nvfp4"}
    assert harness.registry.get_sample_value("tiergate_calibration_ece", labels) is not None
    sampler.configure(settings(shadow={"min_labels": 20}), None)
    assert harness.registry.get_sample_value("tiergate_calibration_ece", labels) is None
