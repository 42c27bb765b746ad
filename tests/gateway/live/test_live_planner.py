"""The live planning loop in one process, fed chosen regimes: its advice rests on evidence
and is measured against the flags the tier runs with (hysteresis, confirmations, drift)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.backends.tier import TierBackend
from gateway.config import Settings, parse_settings
from gateway.live.observer import LiveObserver, RunningFlags, agreed_flags
from gateway.metrics import GatewayMetrics
from gateway.observer.regime import (
    ConcurrencySummary,
    RegimeReport,
    RegimeTracker,
    RhoSummary,
    RSummary,
)

TIER = "bf16"


def report(rho: float | None, r: float | None) -> RegimeReport:
    """32 requests in flight; rho and r as given (None: nothing measured them)."""
    return RegimeReport(
        tier=TIER,
        tenant="*",
        precision=TIER,
        now=0.0,
        window_s=60.0,
        concurrency=ConcurrencySummary(32.0, None, None, None, None),
        rho=RhoSummary(None, rho, None, 0, None),
        r=RSummary(r, None, None, None, None, 0, None, None),
        l_in=None,
        l_out=None,
    )


class Loop:
    """A LiveObserver over one bf16 tier running without speculation, with prefix caching."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        settings, tier = self.config(["--enable-prefix-caching"])
        self.registry = CollectorRegistry()
        self.tiers = [tier]
        self.now = 0.0
        self.observer = LiveObserver(
            settings, GatewayMetrics(self.registry), lambda: self.tiers, clock=lambda: self.now
        )
        self.observer.configure(settings)
        self.regime = report(None, None)
        monkeypatch.setattr(RegimeTracker, "report", lambda _tracker, _tier, _now: self.regime)

    @staticmethod
    def config(vllm_args: list[str]) -> tuple[Settings, TierBackend]:
        settings = parse_settings(
            {
                "model": "m",
                "tiers": [
                    {"name": "nvfp4", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:8/v1"]},
                    {
                        "name": TIER,
                        "precision": TIER,
                        "endpoints": ["http://127.0.0.1:9/v1"],
                        "vllm_args": vllm_args,
                    },
                ],
                "tenants": [{"name": "default", "api_keys": ["k"]}],
                "planner": {"policy": {"dwell_s": 0, "confirmations": 2, "hysteresis": 0.05}},
            }
        )
        return settings, TierBackend(1, TIER, settings.tiers[1], "m")  # the only one observed

    def reload(self, vllm_args: list[str]) -> None:
        settings, tier = self.config(vllm_args)
        self.tiers = [tier]
        self.observer.configure(settings)

    def plan(self, rho: float | None, r: float | None) -> dict[str, Any]:
        self.now += 60.0
        self.regime = report(rho, r)
        self.observer.plan_once()
        entry: dict[str, Any] = self.observer.plan_view()[TIER]
        return entry

    def gauge(self, name: str, flag: str) -> float | None:
        return self.registry.get_sample_value(name, {"tier": TIER, "flag": flag})


def test_an_unmeasured_rho_keeps_prefix_caching_as_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = Loop(monkeypatch)
    # Copy-heavy traffic (r 0.9) whose prompts no sampled request measured yet: a stand-in
    # rho of 0 would advise turning the running prefix cache off; it stays on.
    first = loop.plan(None, 0.9)
    assert first["regime"]["rho"] is None and first["regime"]["r"] == 0.9
    assert first["candidate"]["prefix_caching"] is True
    assert any("not measured yet" in r for r in first["candidate"]["reasons"])
    assert loop.gauge("tiergate_flag_drift", "prefix_caching") == 0.0
    # Speculation pays on r 0.9, but one evaluation is not yet two confirmations: the advice
    # is what runs, and nothing drifts.
    assert first["action"] == "pending"
    assert first["candidate"]["speculative"] is True
    assert first["recommended"]["speculative"] is False
    assert first["recommended"]["reasons"][0].startswith("held: confirmation 1/2")
    assert loop.gauge("tiergate_flag_recommended", "speculative_decoding") == 0.0
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 0.0
    # Confirmed: the advice is to speculate, the running flags drift from it, and the
    # advice stands at the next evaluation (the tier has not been restarted).
    for _ in range(2):
        confirmed = loop.plan(None, 0.9)
        assert confirmed["action"] == "switch" and "candidate" not in confirmed
        assert confirmed["recommended"]["speculative"] is True
        assert confirmed["drift"] == {"speculative": True, "prefix_caching": False}
        assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 1.0
    # Measured: rho 0 now is evidence, and the cache goes off with the same confirmations.
    measured = loop.plan(0.0, 0.9)
    assert measured["regime"]["rho"] == 0.0
    assert measured["action"] == "pending"
    assert measured["candidate"]["prefix_caching"] is False


def test_an_unmeasured_r_keeps_speculation_as_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = Loop(monkeypatch)
    loop.reload(["--speculative-config", '{"method": "ngram"}', "--enable-prefix-caching"])
    entry = loop.plan(0.0, None)  # prompts measured (nothing shared), no answer sampled yet
    assert entry["regime"]["r"] is None and entry["regime"]["rho"] == 0.0
    # rho 0 is evidence: the cache goes off after confirmations; speculation stays on.
    assert entry["candidate"]["speculative"] is True
    assert entry["candidate"]["prefix_caching"] is False
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 0.0


def test_a_reload_that_restarts_the_tier_is_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = Loop(monkeypatch)
    for _ in range(2):
        advised = loop.plan(None, 0.9)
    assert advised["action"] == "switch" and advised["drift"]["speculative"] is True
    # The operator applies the advice and reloads the gateway with the new arguments.
    loop.reload(["--speculative-config", '{"method": "ngram"}', "--enable-prefix-caching"])
    applied = loop.plan(None, 0.9)
    assert applied["running"] == {"speculative": True, "prefix_caching": True}
    assert applied["action"] == "hold" and "candidate" not in applied
    assert applied["drift"] == {"speculative": False, "prefix_caching": False}
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 0.0


def test_replicas_that_disagree_leave_the_flag_unknown() -> None:
    on, off = RunningFlags(True, True), RunningFlags(False, True)
    assert agreed_flags([on, on]).as_tuple() == (True, True)
    assert agreed_flags([on, off]).as_tuple() == (None, True)
    assert agreed_flags([]).as_tuple() == (None, None)
