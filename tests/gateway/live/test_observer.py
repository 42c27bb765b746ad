"""The live observer against simulated tiers: regime, plan, running flags, drift."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.live.observer import first_prompt, flags_from_args, regime_of
from gateway.observer.regime import ConcurrencySummary, RegimeReport, RhoSummary, RSummary
from gateway.planner.params import DEFAULT_ETA
from tests.helpers import MODEL, GatewayThread, Ladder, Sim, free_port, send, wait_for

ADMIN = "observer-admin"


def test_flags_from_vllm_args() -> None:
    assert flags_from_args([]).as_tuple() == (False, True)  # vLLM's defaults
    assert flags_from_args(["--no-enable-prefix-caching"]).as_tuple() == (False, False)
    spec = ["--speculative-config", '{"method": "ngram"}', "--enable-prefix-caching"]
    assert flags_from_args(spec).as_tuple() == (True, True)


def test_flags_from_vllm_args_in_the_other_spellings_vllm_accepts() -> None:
    """vLLM reads `_` as `-` in long options and `--speculative-config.KEY VALUE` as one key
    of the config; both read as "APC on, no speculation" here, a false drift."""
    underscores = ["--no_enable_prefix_caching", "--speculative_config", '{"method": "ngram"}']
    assert flags_from_args(underscores).as_tuple() == (True, False)
    dotted = ["--speculative-config.method", "ngram", "-sc.num_speculative_tokens", "4"]
    assert flags_from_args(dotted).as_tuple() == (True, True)


def report(
    *,
    c_mean: float | None,
    c_engine: float | None,
    rho_engine: float | None,
    rho_lru: float | None,
    r_engine: float | None,
    r_iid: float | None,
) -> RegimeReport:
    return RegimeReport(
        tier="t",
        tenant="*",
        precision="bf16",
        now=0.0,
        window_s=60.0,
        concurrency=ConcurrencySummary(c_mean, None, None, None, c_engine),
        rho=RhoSummary(None, rho_lru, rho_engine, 0, None),
        r=RSummary(r_iid, None, None, None, None, 0, None, r_engine, r_reference=r_iid),
        l_in=None,
        l_out=None,
    )


def test_regime_prefers_engine_counters() -> None:
    assert (
        regime_of(
            report(
                c_mean=None, c_engine=None, rho_engine=None, rho_lru=None, r_engine=None, r_iid=None
            )
        )
        is None
    )
    regime = regime_of(
        report(c_mean=3.0, c_engine=5.0, rho_engine=0.4, rho_lru=0.1, r_engine=0.3, r_iid=0.2)
    )
    assert regime is not None and (regime.concurrency, regime.rho, regime.r) == (5.0, 0.4, 0.3)
    regime = regime_of(
        report(c_mean=3.0, c_engine=0.0, rho_engine=0.4, rho_lru=0.1, r_engine=0.3, r_iid=0.2)
    )  # idle at every scrape instant
    assert regime is not None and regime.concurrency == 3.0
    regime = regime_of(
        report(c_mean=3.0, c_engine=None, rho_engine=None, rho_lru=0.1, r_engine=None, r_iid=0.2)
    )
    assert regime is not None and (regime.concurrency, regime.rho, regime.r) == (3.0, 0.1, 0.2)


def test_a_per_batch_speculation_table_plans_on_the_replays_r() -> None:
    # Rounds the table runs at k = 0 draft nothing and pull the engine's acceptance down.
    measured = report(
        c_mean=3.0, c_engine=5.0, rho_engine=0.4, rho_lru=0.1, r_engine=0.1, r_iid=0.5
    )
    regime = regime_of(measured, engine_r_usable=False)
    assert regime is not None and regime.r == 0.5 and regime.r_known


@pytest.fixture(scope="module")
def observed() -> Iterator[tuple[Ladder, GatewayThread]]:
    ladder = Ladder(
        [
            Sim("nvfp4", free_port(), f"{MODEL}-nvfp4", extra_args=("--prefix-caching",)),
            Sim("w4a16", free_port(), f"{MODEL}-w4a16", extra_args=("--spec-decode",)),
            Sim("bf16", free_port(), f"{MODEL}-bf16"),
        ]
    )
    for sim in ladder.sims:
        sim.start()
    settings = ladder.settings(
        observer={
            "sample_rate": 1.0,
            "scrape_interval_s": 0.5,
            "plan_interval_s": 3600,
            "window_s": 600,
            "bucket_s": 5,
        },
        admin={"token": ADMIN},
        planner={"hardware": "h200", "policy": {"dwell_s": 0, "confirmations": 1}},
    )
    try:
        with GatewayThread(settings) as gw:
            yield ladder, gw
    finally:
        ladder.stop()


def admin(gw: GatewayThread, path: str) -> Any:
    return send("GET", f"{gw.url}{path}", key=ADMIN).json()


def chat(
    gw: GatewayThread, tier: str, messages: list[dict[str, str]], max_tokens: int = 40
) -> None:
    body = {"model": f"{MODEL}@{tier}", "messages": messages, "max_tokens": max_tokens}
    assert send("POST", f"{gw.url}/v1/chat/completions", body).status == 200


def scraped_again(gw: GatewayThread, sim: Sim, times: int) -> Callable[[], bool]:
    """A probe: has the observer read `sim`'s /metrics `times` more times since now?"""
    labels = {"tier": sim.precision, "endpoint": f"{sim.url}/v1", "outcome": "ok"}
    done = gw.metric("tiergate_engine_scrapes_total", labels)
    return lambda: gw.metric("tiergate_engine_scrapes_total", labels) >= done + times


SYSTEM = {"role": "system", "content": "You are a careful assistant for the billing team. " * 20}
CODE = "def total(items):\n    return sum(item.price * item.quantity for item in items)\n" * 6


def test_regime_plan_and_drift(observed: tuple[Ladder, GatewayThread]) -> None:
    ladder, gw = observed
    # Engine counters enter as deltas between scrapes: let the first scrape land before any
    # traffic, so the engine and the replay see the same requests.
    deadline = time.monotonic() + 10
    while admin(gw, "/admin/regime")["tiers"]["nvfp4"]["concurrency"]["engine_mean"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    for i in range(12):
        chat(gw, "nvfp4", [SYSTEM, {"role": "user", "content": f"question {i} about invoices"}])
        chat(
            gw,
            "w4a16",
            [{"role": "user", "content": f"Please rewrite and fix this code {i}:\n{CODE}"}],
            80,
        )
        chat(gw, "bf16", [{"role": "user", "content": f"tell me a fresh story number {i}"}])
    deadline = time.monotonic() + 20
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = admin(gw, "/admin/regime")
        if view["samples"]["processed"] >= 36 and view["tiers"]["w4a16"]["r"]["a_obs"] is not None:
            break
        time.sleep(0.3)
    assert view["samples"] == {"processed": 36, "dropped": 0, "effective_rate": 1.0, "workers": 1}
    # Engine counters arrive by scrape (every 0.5 s): two more on every tier, so that one
    # began after the last request was answered.
    for probe in [scraped_again(gw, sim, times=2) for sim in ladder.sims]:
        assert wait_for(probe)
    view = admin(gw, "/admin/regime")
    tiers = view["tiers"]
    # Shared system prompts: the replay sees prefix sharing, and so does the engine.
    nvfp4 = tiers["nvfp4"]["rho"]
    assert nvfp4["unbounded"] > 0.5 and nvfp4["engine"] is not None
    assert nvfp4["unbounded"] == pytest.approx(nvfp4["engine"], abs=0.02)
    assert tiers["bf16"]["rho"]["unbounded"] < 0.3
    # Copy-heavy answers: n-gram replay finds repetitiveness; the speculating engine agrees.
    w4a16 = tiers["w4a16"]["r"]
    assert w4a16["r_iid"] > tiers["bf16"]["r"]["r_iid"]
    assert w4a16["r_engine"] is not None
    # The replay read w4a16's own completions (acceptance eta * r); corrected to reference
    # precision as the engine's counters are, the two sources agree (uncorrected, they
    # differed by 1 / eta and the plan flipped as speculation came on).
    eta = DEFAULT_ETA["w4a16"]
    assert w4a16["r_reference"] == pytest.approx(min(1.0, w4a16["r_iid"] / eta))
    assert abs(w4a16["r_reference"] - w4a16["r_engine"]) < abs(w4a16["r_iid"] - w4a16["r_engine"])
    assert tiers["bf16"]["r"]["r_reference"] == pytest.approx(tiers["bf16"]["r"]["r_iid"])
    plan = admin(gw, "/admin/plan?refresh=1")["tiers"]
    assert plan["nvfp4"]["running"] == {"speculative": False, "prefix_caching": True}
    assert plan["w4a16"]["running"] == {"speculative": True, "prefix_caching": False}
    for tier in ("nvfp4", "w4a16", "bf16"):
        entry = plan[tier]
        assert "recommended" in entry, (tier, entry)
        assert entry["recommended"]["precision"] == tier  # a tier's precision is its identity
        assert "--kv-cache-dtype" in entry["recommended"]["vllm_args"]
        for flag, key in (
            ("speculative_decoding", "speculative"),
            ("prefix_caching", "prefix_caching"),
        ):
            drift = entry["running"][key] != entry["recommended"][key]
            assert entry["drift"][key] == drift
            assert gw.metric("tiergate_flag_drift", {"tier": tier, "flag": flag}) == float(drift)
            assert gw.metric("tiergate_flag_recommended", {"tier": tier, "flag": flag}) == float(
                entry["recommended"][key]
            )
    assert gw.metric("tiergate_regime_prefix_share", {"tier": "nvfp4", "source": "engine"}) > 0.5
    assert gw.metric("tiergate_regime_concurrency", {"tier": "bf16", "stat": "mean"}) > 0


def test_first_prompt_is_what_choice_zero_answers() -> None:
    assert first_prompt({"messages": [{"role": "user", "content": "hi"}]}, "chat") is None
    assert first_prompt({"prompt": "once"}, "completions") == "once"
    assert first_prompt({"prompt": ["first", "second"]}, "completions") == "first"
    assert first_prompt({"prompt": [5, 6, 7]}, "completions") == [
        5,
        6,
        7,
    ]  # one prompt of token ids
    assert first_prompt({"prompt": [[1, 2], [3]]}, "completions") == [1, 2]
