"""The live observer samples by conversation: the budget lowers the hash threshold, and the
rate a sample was taken at bounds the LRU replay."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.backends.tier import TierBackend
from gateway.config import parse_settings
from gateway.live import observer as observer_module
from gateway.live import upstream
from gateway.live.observer import LiveObserver, Sample
from gateway.metrics import GatewayMetrics
from gateway.observer.sampling_key import is_sampled, request_key_hash
from gateway.planner.costmodel import CostModel
from gateway.planner.planner import fixed_precision_settings
from gateway.stats import CompletedExchange


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def observer_with(clock: Clock, workers: int = 1, **observer: Any) -> LiveObserver:
    settings = parse_settings(
        {
            "model": "m",
            "tiers": [
                {"name": "nvfp4", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:8/v1"]},
                {"name": "bf16", "precision": "bf16", "endpoints": ["http://127.0.0.1:9/v1"]},
            ],
            "tenants": [{"name": "default", "api_keys": ["k"]}],
            "observer": observer,
        }
    )
    backends = [TierBackend(i, t.name, t, "m") for i, t in enumerate(settings.tiers)]
    live = LiveObserver(
        settings, GatewayMetrics(CollectorRegistry()), lambda: backends, clock, workers=workers
    )
    live.configure(settings)
    return live


def chat(conversation: int, turn: int) -> dict[str, Any]:
    """Turn `turn` of a conversation: its root (system and first question) never changes."""
    messages = [
        {"role": "system", "content": "You answer billing questions."},
        {"role": "user", "content": f"Question one of conversation {conversation}"},
    ]
    for t in range(turn):
        messages += [
            {"role": "assistant", "content": f"Answer {t}"},
            {"role": "user", "content": f"Follow-up {t}"},
        ]
    return {"model": "m", "messages": messages}


def test_a_conversation_is_sampled_whole() -> None:
    clock = Clock()
    live = observer_with(clock, sample_rate=0.2, max_samples_per_s=1e6)
    for conversation in range(200):
        decisions = set()
        for turn in range(5):
            clock.now += 0.01
            decisions.add(live.wants_capture("default", 0, chat(conversation, turn), "chat"))
        assert len(decisions) == 1, conversation
        assert decisions.pop() == is_sampled(request_key_hash(chat(conversation, 0)), 0.2)


def test_the_budget_lowers_the_threshold_and_sampling_stays_consistent() -> None:
    clock = Clock()
    live = observer_with(clock, sample_rate=0.1, max_samples_per_s=20.0)
    captured: list[tuple[int, int]] = []
    for step in range(45_000):  # 1000 requests a second over 3000 conversations
        clock.now = step / 1000
        conversation, turn = step % 3000, step // 3000
        if live.wants_capture("default", 0, chat(conversation, turn), "chat"):
            captured.append((conversation, turn))
    rate = live.effective_rate
    assert 20.0 * 2 ** (-1 / 4) < rate * 1000 <= 20.0  # within one budget step
    late = [c for c, t in captured if t >= 10]  # the rate had settled by then (30 s)
    # Only conversations under the lowered threshold: the budget did not pick at random...
    assert all(is_sampled(request_key_hash(chat(c, 0)), rate) for c in late)
    # ...and they are sampled at every turn (the token bucket, a safety cap, rarely bites).
    expected = sum(is_sampled(request_key_hash(chat(c, 0)), rate) for c in range(3000)) * 5
    assert len(late) >= 0.95 * expected
    assert len(captured) / 45 <= 20.0 + 1.0  # the budget holds


def test_no_key_is_computed_when_the_observer_cannot_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def costly(_request: dict[str, Any], _kind: str | None = None) -> int:
        raise AssertionError("hashed a request the observer could not sample")

    monkeypatch.setattr(observer_module, "request_key_hash", costly)
    clock = Clock()
    assert not observer_with(clock, sample_rate=0.0).wants_capture("default", 0, chat(1, 0), "chat")
    off = observer_with(clock, enabled=False, sample_rate=1.0)
    assert not off.wants_capture("default", 0, chat(1, 0), "chat")


def test_the_rate_of_a_sample_bounds_the_lru_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    live = observer_with(clock, sample_rate=0.25)
    backend = live.tiers()[1]
    endpoint: Any = SimpleNamespace(endpoint=SimpleNamespace(url="u"), healthy=True)
    backend.endpoints[:] = [endpoint]

    async def tokenize(_endpoint: Any, _query: dict[str, Any]) -> list[int]:
        return list(range(64))

    monkeypatch.setattr(upstream, "tokenize", tokenize)
    asyncio.run(live.process(Sample("bf16", "default", chat(1, 0), b"", 1.0, 0.25)))
    report = live.regime_view()["tiers"]["bf16"]["rho"]
    capacity = report["capacity_blocks"]
    assert capacity is not None and capacity > 1000
    assert report["sample_rate"] == 0.25
    replay = live._states["bf16"].tracker._tiers["bf16"].lru
    assert replay.capacity_blocks == round(capacity * 0.25)


def test_a_reload_keeps_the_arrival_rate_and_with_it_the_sampled_conversations() -> None:
    """A reload (any edit of the file) re-reads the observer's settings: it reset the arrival
    rate to 0 and the threshold to the full sample_rate, so at 1000 requests a second every
    reload sampled other conversations, at random under the bucket, for tens of seconds."""
    clock = Clock()
    live = observer_with(clock, sample_rate=0.1, max_samples_per_s=20.0)
    for step in range(30_000):  # 1000 requests a second: the rate settles
        clock.now = step / 1000
        live.wants_capture("default", 0, chat(step % 3000, step // 3000), "chat")
    settled = live.effective_rate
    assert settled * 1000 <= 20.0
    live.configure(live.settings)  # a reload that changes nothing about the observer
    assert live.effective_rate == settled
    for step in range(30_000, 31_500):
        clock.now = step / 1000
        live.wants_capture("default", 0, chat(step % 3000, step // 3000), "chat")
    assert live.effective_rate == settled


def test_steady_traffic_near_a_budget_step_does_not_flip_the_threshold() -> None:
    """Poisson arrivals at a steady 238 a second, where 0.1 * 2^(-1/4) meets the cap of 20:
    the EWMA's noise crossed the step's boundary and the threshold flipped about every six
    seconds, sampling the conversations between the two steps on some turns only."""
    clock = Clock()
    live = observer_with(clock, sample_rate=0.1, max_samples_per_s=20.0)
    arrivals = random.Random(7)
    rates = []
    while clock.now < 300.0:
        clock.now += arrivals.expovariate(200 * 2 ** (1 / 4))
        live.wants_capture("default", 0, chat(arrivals.randrange(3000), 0), "chat")
        if clock.now > 60.0:  # the EWMA has settled
            rates.append(live.effective_rate)
    changes = sum(1 for before, after in itertools.pairwise(rates) if before != after)
    assert changes <= 2
    assert rates[-1] * 200 * 2 ** (1 / 4) <= 20.0


def completed(request: dict[str, Any]) -> CompletedExchange:
    return CompletedExchange("default", "chat", "bf16", 1, request, b"", None, None, "x")


def test_a_sample_whose_conversation_the_rate_left_out_since_capture_is_not_replayed() -> None:
    """A reload while a sampled answer streamed (observer off, or a lower sample_rate)
    queued it at the new rate: at 0 the tier's LRU replay shrank to one block and
    /admin/regime read sample_rate 0."""
    clock = Clock()
    live = observer_with(clock, sample_rate=0.5)
    request = next(
        chat(c, 0)
        for c in range(200)
        if not is_sampled(request_key_hash(chat(c, 0)), 0.1)
        and live.wants_capture("default", 1, chat(c, 0), "chat")
    )
    kept = next(chat(c, 0) for c in range(200) if is_sampled(request_key_hash(chat(c, 0)), 0.1))

    async def scenario() -> list[Sample]:
        live.start()
        assert live._queue is not None
        lower = live.settings.model_copy(
            update={"observer": live.observer.model_copy(update={"sample_rate": 0.1})}
        )
        live.configure(lower)
        live.exchange_done(completed(request))
        live.exchange_done(completed(kept))  # still sampled at 0.1
        off = live.settings.model_copy(
            update={"observer": live.observer.model_copy(update={"enabled": False})}
        )
        live.configure(off)
        live.exchange_done(completed(kept))
        queued = []
        while not live._queue.empty():
            queued.append(live._queue.get_nowait())
        return queued

    queued = asyncio.run(scenario())
    assert [(sample.request, sample.rate) for sample in queued] == [(kept, 0.1)]


def test_a_reload_that_changes_the_window_applies_it_to_the_kept_tiers() -> None:
    """A kept tier kept its tracker, built for the old window: /admin/regime went on reporting
    over 300 s after the file said 60 (only tiers added by the reload got the new one)."""
    clock = Clock()
    live = observer_with(clock, window_s=300.0)
    live.wants_capture("default", 1, chat(1, 0), "chat")
    shorter = live.settings.model_copy(
        update={"observer": live.observer.model_copy(update={"window_s": 60.0})}
    )
    live.configure(shorter)
    assert live.regime_view()["tiers"]["bf16"]["window_s"] == 60.0
    unchanged = live._states["bf16"].tracker
    live.configure(live.settings)  # a reload that changes nothing keeps the history
    assert live._states["bf16"].tracker is unchanged


def test_a_reload_that_changes_the_planner_settings_reaches_the_kept_tiers() -> None:
    """A kept tier kept its planner: after `planner.hardware: h200` it went on planning for
    a B200, while the running configuration's expected cost was priced for the H200."""
    clock = Clock()
    live = observer_with(clock)
    planner = live._states["bf16"].planner
    h200 = live.settings.model_copy(
        update={"planner": live.settings.planner.model_validate({"hardware": "h200"})}
    )
    live.configure(h200)
    assert live._states["bf16"].planner is planner  # its current configuration and dwell stay
    assert planner.settings == fixed_precision_settings(h200.planner)
    eta = CostModel.from_settings(h200.planner).eta("bf16")
    assert live._states["bf16"].tracker._tiers["bf16"].eta == eta


def test_requests_in_flight_when_the_observer_is_turned_off_leave_no_phantom_level() -> None:
    """Their finish events were not recorded while off: the tier read 5 in flight for good,
    off and after being turned on again, and the planner planned on it with no traffic."""
    clock = Clock()
    live = observer_with(clock)
    for _ in range(5):
        live.upstream_started("bf16", "default")
    clock.now = 1.0
    off = live.settings.model_copy(
        update={"observer": live.observer.model_copy(update={"enabled": False})}
    )
    live.configure(off)
    for _ in range(5):
        live.upstream_finished("bf16", "default")
    on = live.settings.model_copy(
        update={"observer": live.observer.model_copy(update={"enabled": True})}
    )
    live.configure(on)
    clock.now = 400.0
    assert live.regime_view()["tiers"]["bf16"]["concurrency"]["mean"] in (None, 0.0)
    live.plan_once()
    assert live.plan_view()["bf16"]["note"] == "no traffic in the window"


def test_a_worker_samples_its_share_of_the_cap_and_replays_its_share_of_the_cache() -> None:
    """Under `serve --workers 2` each worker sees half the traffic: with the cap and the LRU
    bound of one process, the samples were twice max_samples_per_s in all and each replay
    held the whole sampled share of the engine's cache for half the requests (its rho read
    high: 0.071-0.097 against 0.059-0.072 on Mooncake)."""
    clock = Clock()
    live = observer_with(clock, workers=2, sample_rate=0.1, max_samples_per_s=20.0)
    captured = 0
    for step in range(45_000):  # this worker's half: 500 requests a second
        clock.now = step / 500
        conversation, turn = step % 3000, step // 3000
        captured += live.wants_capture("default", 0, chat(conversation, turn), "chat")
    assert captured / 90 <= 10.0 + 0.5  # half of the cap for each of the two workers
    assert 10.0 * 2 ** (-1 / 4) < live.effective_rate * 500 <= 10.0
    sampled = next(
        chat(c, 0)
        for c in range(3000)
        if is_sampled(request_key_hash(chat(c, 0)), live.effective_rate)
    )

    async def queued() -> Sample:
        live.start()
        assert live._queue is not None
        live.exchange_done(completed(sampled))
        return live._queue.get_nowait()

    assert asyncio.run(queued()).rate == live.effective_rate / 2  # half the sampled traffic


def test_queued_samples_are_bounded_in_bytes() -> None:
    """1,000 samples of 4 MiB requests (the body limit) held 4 GiB while /tokenize was slow:
    the queue was bounded in samples only. A sample past the byte bound is dropped."""
    live = observer_with(Clock(), sample_rate=1.0)

    async def scenario() -> list[Sample]:
        live.start()
        assert live._queue is not None
        live._queue.max_bytes = 10_000
        big = dataclasses.replace(completed(chat(0, 0)), request_bytes=6000)
        live.exchange_done(big)
        live.exchange_done(dataclasses.replace(big, request=chat(1, 0)))  # 12,000 bytes
        queued = [live._queue.get_nowait()]
        assert live._queue.empty() and live._queue.bytes == 0
        return queued

    assert len(asyncio.run(scenario())) == 1 and live.dropped == 1
