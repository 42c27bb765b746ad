"""Issue 9 end to end: shadow labels recalibrate the shipped router to the traffic it serves.

The shipped model was calibrated on Llama-3.1-8B precision data, where the cheapest tier is
adequate 95% of the time; the simulator's quality model makes NVFP4 diverge on a larger
share of this traffic. After N requests with shadow evaluation on, the router's predicted
adequacy must move to the simulator's true adequacy and routing must serve fewer
inadequate answers. The errors before and after are printed.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from gateway.config import parse_settings
from gateway.routing.factory import build_policy
from gateway.routing.router import RouterPolicy
from gateway.sim import quality
from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, send

pytestmark = pytest.mark.slow

TIERS = ("nvfp4", "w4a16", "bf16")
TRAIN = 1000  # requests with shadow evaluation on


def prompts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    names = ["Ana", "Bo", "Chen", "Dee", "Eli", "Fay"]
    things = ["fruits", "rivers", "planets", "colours", "metals"]
    code = (
        "def step(state, item):\n    state.total += item.price * item.quantity\n    return state\n"
    )
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.35:
            out.append(
                rng.choice(
                    [
                        f"hello {rng.choice(names)}, thanks!",
                        f"Translate 'good night {rng.randint(1, 99)}' into French.",
                        f"List three {rng.choice(things)}.",
                    ]
                )
            )
        elif kind < 0.65:
            out.append(
                f"Explain why the {rng.choice(things)} example number {rng.randint(1, 999)} matters, in two sentences."
            )
        else:
            lines = code * rng.randint(3, 25)
            out.append(
                rng.choice(
                    [
                        f"Prove that the algorithm below terminates and refactor it ({rng.randint(1, 999)}).\n```python\n{lines}```",
                        f"Debug this concurrent code and optimize it; explain the race condition.\n{lines}",
                        f"Solve 3x + {rng.randint(1, 99)} = {rng.randint(100, 999)} and derive the general formula, then prove it.",
                    ]
                )
            )
    return out


def body(text: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 12}


def settled(gw: GatewayThread) -> None:
    """Waits until shadow evaluation has drained and a refit has seen every label."""
    shadow, deadline = gw.app.shadow, time.monotonic() + 120
    idle_since = None
    while time.monotonic() < deadline:
        queue = shadow._queue
        idle = queue is not None and queue.empty() and shadow.inflight == 0
        idle_since = (idle_since or time.monotonic()) if idle else None
        recalibrator = gw.app.recalibrator
        labels = recalibrator._arrived.get("team", 0) if recalibrator else 0
        fitted = recalibrator._fitted_at.get("team") if recalibrator else None
        if idle_since and time.monotonic() - idle_since > 1.0 and labels and fitted == labels:
            return
        time.sleep(0.2)
    raise AssertionError("shadow evaluation or recalibration did not settle")


def evaluate(policy: RouterPolicy, tenant: Any, texts: list[str]) -> dict[str, float]:
    """Calibration of P(nvfp4 adequate) against the simulator's truth, and served quality."""
    predicted, truth, served_ok, cost = [], [], [], 0.0
    costs = {"nvfp4": 0.25, "w4a16": 0.25, "bf16": 1.0}
    for text in texts:
        decision = policy.decide(body(text), "chat", tenant)
        assert decision.probabilities is not None
        predicted.append(decision.probabilities[0])
        truth.append(quality.adequate(text, "nvfp4"))
        tier = TIERS[decision.tier]
        served_ok.append(quality.adequate(text, tier))  # type: ignore[arg-type]
        cost += costs[tier]
    n = len(texts)
    return {
        "calibration_error": abs(sum(predicted) / n - sum(truth) / n),
        "brier": sum((p - t) ** 2 for p, t in zip(predicted, truth, strict=True)) / n,
        "true_adequacy": sum(truth) / n,
        "predicted_adequacy": sum(predicted) / n,
        "served_quality": sum(served_ok) / n,
        "cost": cost / n,
    }


def test_shadow_labels_recalibrate_the_router() -> None:
    ladder = Ladder.start(extra_args=("--time-scale", "0.05"))
    try:
        data = ladder.settings().model_dump(mode="json")
        data["tenants"] = [
            {"name": "team", "api_keys": [API_KEY], "thresholds": {"nvfp4": 0.8, "w4a16": 0.8}}
        ]
        data["shadow"] = {
            "rate": 1.0,
            "explore_rate": 1.0,
            "assume_deterministic": True,
            "min_labels": 50,
            "recalibrate_interval_s": 0.5,
            "prior_weight": 20,
            "max_concurrency": 4,
            "queue_size": 2048,
        }
        config = parse_settings(data)
        with GatewayThread(config, policy_factory=build_policy) as gw:
            policy = gw.app.runtime.policy
            assert isinstance(policy, RouterPolicy)
            tenant = gw.app.runtime.tenants.tenants["team"]
            held_out = prompts(seed=2, n=1000)
            before = evaluate(policy, tenant, held_out)
            for text in prompts(seed=1, n=TRAIN):
                assert send("POST", f"{gw.url}/v1/chat/completions", body(text)).status == 200
            settled(gw)
            assert gw.metric("tiergate_recalibrations_total", {"tenant": "team"}) >= 1
            after = evaluate(policy, tenant, held_out)
        print(f"\nbefore recalibration: {before}\nafter  recalibration: {after}")
        assert before["calibration_error"] > 0.15  # the shipped prior does not know this traffic
        assert after["calibration_error"] < 0.04
        assert after["brier"] < before["brier"]
        assert after["served_quality"] > before["served_quality"] + 0.05
    finally:
        ladder.stop()
