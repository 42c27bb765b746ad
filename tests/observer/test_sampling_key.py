"""Consistent sampling for the prefix replay: the key, the threshold, the budget, and what
it does to rho on a multi-turn workload."""

from __future__ import annotations

import random
import subprocess
import sys
from typing import Any

import pytest

from gateway.observer.prefix_replay import PrefixCacheReplay
from gateway.observer.regime import RegimeTracker, TrackerConfig
from gateway.observer.sampling_key import (
    HASH_RANGE,
    PROMPT_HEAD,
    ArrivalRate,
    budget_rate,
    held_rate,
    is_sampled,
    request_key_hash,
    sampling_key,
    scaled_capacity,
)

Request = tuple[dict[str, Any], list[int]]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def words(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(1000, 50_000) for _ in range(rng.randint(low, high))]


def conversation(rng: random.Random, system_ids: list[int]) -> list[Request]:
    """2-8 turns; each prompt holds the previous prompt, its answer and a new question."""
    messages: list[dict[str, str]] = [SYSTEM]
    ids = list(system_ids)
    turns: list[Request] = []
    for _ in range(rng.randint(2, 8)):
        question = words(rng, 16, 96)
        messages = [*messages, {"role": "user", "content": " ".join(map(str, question))}]
        ids = ids + question
        turns.append(({"model": "m", "messages": messages}, ids))
        answer = words(rng, 32, 128)
        messages = [*messages, {"role": "assistant", "content": " ".join(map(str, answer))}]
        ids = ids + answer
    return turns


def multi_turn_workload(seed: int, conversations: int) -> list[Request]:
    """Conversations under one shared system prompt, their turns interleaved in time."""
    rng = random.Random(seed)
    system_ids = [rng.randrange(1000, 50_000) for _ in range(64)]
    pending = [conversation(rng, system_ids)[::-1] for _ in range(conversations)]
    order: list[Request] = []
    while pending:
        i = rng.randrange(len(pending))
        order.append(pending[i].pop())
        if not pending[i]:
            pending.pop(i)
    return order


def replay_rho(requests: list[Request], capacity_blocks: int | None = None) -> float:
    replay = PrefixCacheReplay(16, capacity_blocks)
    for _, ids in requests:
        replay.lookup_and_insert(ids)
    return replay.hit_rate


def consistent_sample(requests: list[Request], rate: float) -> list[Request]:
    return [r for r in requests if is_sampled(request_key_hash(r[0]), rate)]


def test_consistent_sampling_keeps_rho_where_a_coin_per_request_loses_it() -> None:
    workload = multi_turn_workload(seed=0, conversations=300)
    full = replay_rho(workload)
    coin = random.Random(1)
    per_request = replay_rho([r for r in workload if coin.random() < 0.1])
    consistent = replay_rho(consistent_sample(workload, 0.1))
    assert full == pytest.approx(0.72, abs=0.02)
    # A coin per request caches a tenth of each conversation's turns: most of the sharing
    # goes unseen. Sampled by conversation, every turn of a sampled one is replayed.
    assert per_request < 0.5 * full
    assert consistent == pytest.approx(full, abs=0.05)


def test_the_lru_bound_scales_with_the_rate() -> None:
    """The tracker's LRU replay of a 0.1 sample holds 0.1 of the engine's cache (SHARDS):
    it then finds what the full replay finds; at the engine's size it finds far more."""
    workload = multi_turn_workload(seed=1, conversations=600)
    capacity = 500
    full = replay_rho(workload, capacity)
    sample = consistent_sample(workload, 0.1)
    tracker = RegimeTracker(TrackerConfig(window_s=60, bucket_s=60, block_size=16))
    tracker.configure_tier("t", capacity_blocks=capacity)
    for _, ids in sample:
        tracker.prompt_sampled("t", "a", 1.0, ids, sample_rate=0.1)
    rho = tracker.report("t", 1.0).rho
    assert rho.capacity_blocks == capacity and rho.sample_rate == 0.1
    assert rho.lru == pytest.approx(full, abs=0.05)
    assert replay_rho(sample, capacity) > 2 * full  # unscaled: a cache ten times too big


def test_the_replay_bound_follows_a_new_rate() -> None:
    tracker = RegimeTracker(TrackerConfig(block_size=16))
    tracker.configure_tier("t", capacity_blocks=1000)
    tracker.prompt_sampled("t", "a", 1.0, list(range(64)), sample_rate=0.5)
    assert tracker._tiers["t"].lru.capacity_blocks == 500
    tracker.prompt_sampled("t", "a", 2.0, list(range(64)), sample_rate=0.25)
    assert tracker._tiers["t"].lru.capacity_blocks == 250
    tracker.configure_tier("t", capacity_blocks=2000)  # e.g. num_gpu_blocks scraped
    assert tracker._tiers["t"].lru.capacity_blocks == 500
    assert tracker.report("t", 2.0).rho.capacity_blocks == 2000


def test_scaled_capacity() -> None:
    assert scaled_capacity(None, 0.1) is None
    assert scaled_capacity(1000, 1.0) == 1000
    assert scaled_capacity(1000, 0.1) == 100
    assert scaled_capacity(3, 0.01) == 1  # never a cache that holds nothing


def test_the_key_is_the_conversations_root() -> None:
    rng = random.Random(2)
    first, second = conversation(rng, []), conversation(rng, [])
    assert len({request_key_hash(request) for request, _ in first}) == 1
    assert request_key_hash(first[0][0]) != request_key_hash(second[0][0])
    # Text parts read as the string they make; images and later messages do not count.
    parts = {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is "},
                    {"type": "image_url", "image_url": {"url": "data:x"}},
                    {"type": "text", "text": "this?"},
                ],
            },
            {"role": "system", "content": "A reminder added at turn 2."},
        ]
    }
    plain = {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "What is this?"},
        ]
    }
    assert sampling_key(parts) == sampling_key(plain)
    # A long shared system prompt: conversations still differ by their first question.
    long_system = {"role": "system", "content": "Rules. " * 1000}
    keys = {
        request_key_hash({"messages": [long_system, {"role": "user", "content": f"q{i}"}]})
        for i in range(50)
    }
    assert len(keys) == 50


def test_a_completions_key_is_the_prompts_head() -> None:
    head = "x" * PROMPT_HEAD
    assert request_key_hash({"prompt": head + "turn 1"}) == request_key_hash(
        {"prompt": head + "turn 1, answer, turn 2"}
    )
    assert request_key_hash({"prompt": "a story"}) != request_key_hash({"prompt": "a poem"})
    ids = list(range(300))
    assert request_key_hash({"prompt": ids}) == request_key_hash({"prompt": [*ids, 7]})
    assert request_key_hash({"prompt": ["first", "second"]}) == request_key_hash(
        {"prompt": "first"}
    )


def test_the_endpoint_decides_which_field_is_keyed() -> None:
    """vLLM reads a chat body's messages and a completions body's prompt, and ignores the
    other: a stray field must not move a request into another conversation's sample."""
    user = [{"role": "user", "content": "a stray question"}]
    stray_messages = {"prompt": "a story", "messages": user}
    assert request_key_hash(stray_messages, "completions") == request_key_hash(
        {"prompt": "a story"}
    )
    assert request_key_hash(stray_messages, "completions") != request_key_hash(stray_messages)
    stray_prompt = {"messages": "not a list", "prompt": "a story"}
    assert sampling_key(stray_prompt, "chat") == sampling_key({"messages": []})


@pytest.mark.parametrize(
    "request_",
    [
        {},
        {"messages": None},
        {"messages": [None, 3, {"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": [None, {"text": 3}]}]},
        {"messages": [{"role": "user", "content": "\ud800 lone surrogate"}]},
        {"prompt": None},
        {"prompt": [[1, 2], [3]]},
        {"prompt": []},
    ],
)
def test_any_request_has_a_key(request_: dict[str, Any]) -> None:
    assert 0 <= request_key_hash(request_) < 1 << 32  # on the request path: never raises


KNOWN = {
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello there"},
    ]
}


def test_the_hash_is_stable_across_processes() -> None:
    """Not Python's salted str hash: a restart or another worker samples the same keys."""
    code = (
        "from gateway.observer.sampling_key import request_key_hash as h;"
        f"print(h({KNOWN!r}), h({{'prompt': 'Once upon a time'}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PYTHONPATH": ":".join(sys.path)},
    ).stdout.split()
    here = [request_key_hash(KNOWN), request_key_hash({"prompt": "Once upon a time"})]
    assert [int(v) for v in out] == here
    assert here == [1773632163, 3882332213]  # known values: the same in every release


def test_a_lower_rate_samples_a_subset() -> None:
    hashes = [request_key_hash({"prompt": f"p{i}"}) for i in range(2000)]
    at_10 = {h for h in hashes if is_sampled(h, 0.1)}
    at_5 = {h for h in hashes if is_sampled(h, 0.05)}
    assert at_5 < at_10
    assert len(at_10) == pytest.approx(200, abs=40)  # the hash spreads over its range


def test_the_budget_lowers_the_rate_by_steps() -> None:
    assert budget_rate(0.1, 100.0, 20.0) == 0.1  # 10 samples/s fit
    assert budget_rate(0.0, 1e6, 20.0) == 0.0
    for arrivals in (201.0, 500.0, 1000.0, 12_345.0):
        rate = budget_rate(0.1, arrivals, 20.0)
        assert rate * arrivals <= 20.0 * (1 + 1e-9)
        assert rate * arrivals > 20.0 * 2 ** (-1 / 4)  # within one step of the budget
    # Steps: the rate (and the set of sampled conversations) holds while traffic drifts.
    assert budget_rate(0.1, 1000.0, 20.0) == budget_rate(0.1, 1050.0, 20.0)
    assert budget_rate(0.1, 1000.0, 20.0) == pytest.approx(0.1 / 2 ** (10 / 4))


def test_the_held_rate_drops_at_once_and_rises_a_step_late() -> None:
    step = 2 ** (1 / 4)
    at_1000 = budget_rate(0.1, 1000.0, 20.0)
    assert held_rate(0.1, 0.1, 1000.0, 20.0) == at_1000  # the budget binds at once
    # Traffic back just under the boundary of the higher step: the rate holds...
    assert held_rate(at_1000, 0.1, 1000.0 / step * 0.99, 20.0) == at_1000
    # ...and rises once the higher step would still fit a step more traffic.
    assert held_rate(at_1000, 0.1, 1000.0 / step**2 * 0.99, 20.0) == pytest.approx(at_1000 * step)
    assert held_rate(at_1000, 0.1, 1.0, 20.0) == 0.1


def test_arrival_rate() -> None:
    arrivals = ArrivalRate(period_s=1.0, tau_s=5.0)
    now = 0.0
    updated = 0
    for _ in range(200):  # a burst of two seconds at 100 per second
        updated += arrivals.arrived(now)
        now += 0.01
    assert updated == 1 and arrivals.per_s < 20.0  # the bucket's business, not the rate's
    for _ in range(4800):
        updated += arrivals.arrived(now)
        now += 0.01
    assert updated == 49 and arrivals.per_s == pytest.approx(100.0, rel=0.02)
    assert arrivals.arrived(now + 600.0)  # ten idle minutes: the rate falls at once
    assert arrivals.per_s < 1.0


def test_a_zero_rate_samples_nothing_and_a_full_rate_everything() -> None:
    assert not is_sampled(0, 0.0)  # the lowest hash too: rate 0 is off
    assert is_sampled(HASH_RANGE - 1, 1.0)


def test_the_held_rate_never_drops_below_the_current_one_when_the_budget_allows_it() -> None:
    """A rate off the budget's steps (the sample rate changed on a reload) that the budget
    does not need lowered stays: the hysteresis may delay a rise, never cause a drop."""
    assert budget_rate(1.0, 0.9, 1.0) == 1.0  # the budget would allow the full rate
    assert held_rate(0.9, 1.0, 0.9, 1.0) == 0.9
