"""The b.1 procedure: archetypes, tie-breaks, never-inherited toggles, hysteresis loop."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from gateway.planner.costmodel import CostModel
from gateway.planner.params import PolicyParams, Settings, settings_from_mapping
from gateway.planner.planner import (
    PAPER_CANDIDATES,
    Planner,
    PlanningError,
    Regime,
    TierConfig,
    _speculation_batch_ranges,
    fixed_precision_settings,
    plan_tier,
)
from gateway.precision import Precision

B200 = Settings()
H200 = settings_from_mapping({"hardware": "h200"})

# Archetypes of Paper B as regimes. A coding agent loops over a stable repository context
# (high rho, high r) and holds a stricter quality floor: code errors are visible.
CODING_AGENT = Regime(concurrency=32, rho=0.85, r=0.6)
CODING_Q_MIN = 0.99
OPEN_CHAT = Regime(concurrency=64, rho=0.05, r=0.03)
SATURATED_BATCH_LOW_RHO = Regime(concurrency=1024, rho=0.30, r=0.20)
SATURATED_BATCH_HIGH_RHO = Regime(concurrency=1024, rho=0.95, r=0.20)


@pytest.mark.parametrize("settings", [B200, H200], ids=["b200", "h200"])
def test_coding_agent_fp8_with_speculation_and_prefix_caching(settings: Settings) -> None:
    plan = plan_tier(CODING_AGENT, settings, q_min=CODING_Q_MIN)
    assert (plan.precision, plan.speculative, plan.prefix_caching) == ("fp8", True, True)
    assert any("dropped" in r and "nvfp4" in r for r in plan.reasons)


@pytest.mark.parametrize("settings", [B200, H200], ids=["b200", "h200"])
@pytest.mark.parametrize("candidates", [PAPER_CANDIDATES, ("bf16", "fp8", "w4a16", "nvfp4")])
def test_open_chat_lowest_precision_both_off(settings: Settings, candidates: tuple[str]) -> None:
    plan = plan_tier(OPEN_CHAT, settings, candidates)  # type: ignore[arg-type]
    assert plan.precision == "nvfp4"
    assert (plan.speculative, plan.prefix_caching) == (False, False)


@pytest.mark.parametrize("settings", [B200, H200], ids=["b200", "h200"])
def test_saturated_batch_nvfp4_spec_off_cache_by_rho(settings: Settings) -> None:
    low = plan_tier(SATURATED_BATCH_LOW_RHO, settings)
    high = plan_tier(SATURATED_BATCH_HIGH_RHO, settings)
    assert (low.precision, low.speculative, low.prefix_caching) == ("nvfp4", False, False)
    assert (high.precision, high.speculative, high.prefix_caching) == ("nvfp4", False, True)
    assert low.b_eff == low.knee  # above the knee: B_eff is the knee


def test_w4a16_nvfp4_tie_breaks() -> None:
    # Same bytes, same knee: equal decode cost. Without speculation eta does not matter and
    # the higher Q wins (NVFP4); with speculation on at both, the higher eta wins (W4A16).
    quiet = plan_tier(Regime(256, 0.1, 0.0), B200, ("w4a16", "nvfp4"))
    assert quiet.precision == "nvfp4"
    assert any("ties w4a16" in r for r in quiet.reasons)
    copying = plan_tier(Regime(32, 0.1, 0.9), B200, ("w4a16", "nvfp4"))
    assert copying.precision == "w4a16" and copying.speculative
    # Equal Q and eta: native compute decides (NVFP4 computes in FP4 on B200; on H200 it
    # is emulated through Marlin, so W4A16 wins).
    flat_eta = {"cost": {"quality": {"w4a16": 0.98, "nvfp4": 0.98}, "eta": {"w4a16": 0.698}}}
    on_b200 = plan_tier(Regime(256, 0.1, 0.0), settings_from_mapping(flat_eta), ("w4a16", "nvfp4"))
    on_h200 = plan_tier(
        Regime(256, 0.1, 0.0),
        settings_from_mapping({**flat_eta, "hardware": "h200"}),
        ("nvfp4", "w4a16"),
    )
    assert on_b200.precision == "nvfp4"
    assert on_h200.precision == "w4a16"


def test_require_native_compute_drops_nvfp4_on_h200() -> None:
    strict = H200.model_copy(update={"policy": PolicyParams(require_native_compute=True)})
    plan = plan_tier(OPEN_CHAT, strict)
    assert plan.precision == "w4a16"
    assert any("no native compute" in r for r in plan.reasons)


def test_a_precision_without_a_checkpoint_is_dropped_not_a_key_error() -> None:
    """A model mapping that names checkpoints for some tiers only: planning picked w4a16
    and failed on `checkpoints["w4a16"]` with a bare KeyError."""
    geometry = B200.model.model_dump()
    geometry["checkpoints"] = {"bf16": {"repo": "me/bf16"}, "fp8": {"repo": "me/fp8"}}
    partial = settings_from_mapping({"model": geometry})
    plan = plan_tier(OPEN_CHAT, partial)
    assert plan.precision == "fp8" and plan.vllm_args[0] == "me/fp8"
    assert "w4a16 (no checkpoint in model.checkpoints)" in plan.reasons[0]
    with pytest.raises(PlanningError, match="no checkpoint"):
        plan_tier(OPEN_CHAT, partial, ["nvfp4"])


def test_toggles_recomputed_not_inherited() -> None:
    # b.1 notes: C = 256, r = 0.30; speculation pays at FP16 but not at NVFP4.
    regime = Regime(256, 0.3, 0.30)
    at_fp16 = plan_tier(regime, B200, ("fp16",))
    assert at_fp16.speculative
    moved = plan_tier(regime, B200, PAPER_CANDIDATES, current=at_fp16.config)
    assert moved.precision == "nvfp4" and not moved.speculative
    note = next(r for r in moved.reasons if "not inherited" in r)
    assert "+14.7% decode" in note


def test_prefix_caching_harder_at_lower_precision_above_fp16_knee() -> None:
    # Above FP16's knee, NVFP4's bigger batch raises rho*: the same rho can flip k off.
    regime = Regime(430, 0.80, 0.0)
    assert plan_tier(regime, B200, ("fp16",)).prefix_caching
    assert not plan_tier(regime, B200, ("nvfp4",)).prefix_caching


def test_plan_fields_and_args() -> None:
    plan = plan_tier(Regime(32, 0.3, 0.2), B200, PAPER_CANDIDATES)
    assert plan.rho_star == pytest.approx(0.064)
    assert plan.r_star == pytest.approx(0.1406, abs=1e-4)
    assert plan.expected_cpt * 1e6 == pytest.approx(24.078, abs=1e-3)
    assert plan.vllm_args[0] == "nvidia/Qwen3-30B-A3B-NVFP4"
    assert "--enable-prefix-caching" in plan.vllm_args
    assert "--speculative-config" in plan.vllm_args
    doc = plan.to_dict()
    assert doc["precision"] == "nvfp4" and isinstance(doc["reasons"], list)
    assert set(doc["alternatives"]) >= {"nvfp4 s=1 k=1", "fp16 s=0 k=0"}


def test_infinite_r_star_serialises_as_null() -> None:
    heavy = settings_from_mapping({"cost": {"beta": 0.05}})
    plan = plan_tier(Regime(1024, 0.0, 1.0), heavy, ("fp16",))
    assert math.isinf(plan.r_star) and plan.to_dict()["r_star"] is None
    assert not plan.speculative


def test_batch_dependent_speculation_cutoff() -> None:
    settings = settings_from_mapping({"serve": {"batch_dependent_speculation": True}})
    plan = plan_tier(Regime(32, 0.0, 0.30), settings, ("fp16",))
    spec = plan.vllm_args[plan.vllm_args.index("--speculative-config") + 1]
    assert '"num_speculative_tokens_per_batch_size": [[1, ' in spec
    # r = 0.30 beats r*(fp16, B) up to B = 263 (r* = 0.29 at 256).
    cutoff = int(spec.split("[[1, ")[1].split(",")[0])
    assert 256 <= cutoff < 325


def test_per_batch_speculation_speculates_at_the_planned_batch_under_expert_union() -> None:
    # X1 makes r* U-shaped in B (verify tokens widen the expert union most at small
    # batches): the table must follow r vs r*(B) everywhere, not bisect on a monotone r*.
    settings = settings_from_mapping(
        {
            "cost": {"extensions": {"expert_union": True}},
            "serve": {"batch_dependent_speculation": True},
        }
    )
    plan = plan_tier(Regime(64, 0.0, 0.6), settings, ("w4a16",))
    assert plan.speculative
    spec = plan.vllm_args[plan.vllm_args.index("--speculative-config") + 1]
    table = json.loads(spec)["num_speculative_tokens_per_batch_size"]
    assert table[0][0] == 1 and table[-1][1] == settings.cost.max_num_seqs
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(table))
    k_at = {b: k for first, last, k in table for b in range(first, last + 1)}
    assert k_at[64] == 4  # speculation pays at B_eff = 64: the engine must speculate there
    assert k_at[1] == 0  # and not at batch 1, where r* > 1


@pytest.mark.parametrize("expert_union", [False, True])
def test_per_batch_table_follows_r_star_at_every_batch(expert_union: bool) -> None:
    # The table tests A(eta r) > R(B) rather than inverting A per batch; it must say
    # "speculate" exactly where r > r*(p, B), the cost model's own definition.
    settings = settings_from_mapping(
        {
            "cost": {"extensions": {"expert_union": expert_union}},
            "serve": {"batch_dependent_speculation": True},
        }
    )
    model = CostModel.from_settings(settings)
    precisions: tuple[Precision, ...] = ("fp16", "w4a16", "nvfp4")
    for p, r, ctx in itertools.product(precisions, (0.07, 0.3, 0.61, 0.93), (512.0, 6000.0)):
        runs = _speculation_batch_ranges(model, p, r, ctx)
        on_at = {b: on for first, last, on in runs for b in range(first, last + 1)}
        expected = {
            b: r > model.r_star_at_batch(b, p, ctx) for b in range(1, model.params.max_num_seqs + 1)
        }
        assert on_at == expected, (p, r, ctx)


def test_held_speculation_gets_no_table_that_turns_it_off() -> None:
    settings = settings_from_mapping({"serve": {"batch_dependent_speculation": True}})
    running = TierConfig("fp16", True, False)
    plan = plan_tier(Regime(256, 0.0, 0.0), settings, ("fp16",), running, hold=True)
    assert plan.speculative  # held as it runs, though r = 0 pays at no batch
    spec = plan.vllm_args[plan.vllm_args.index("--speculative-config") + 1]
    assert "num_speculative_tokens_per_batch_size" not in spec


def test_no_feasible_precision() -> None:
    with pytest.raises(PlanningError, match="no feasible"):
        plan_tier(OPEN_CHAT, B200, ("nvfp4",), q_min=0.999)


@pytest.mark.parametrize(("c", "rho", "r"), [(0, 0.1, 0.1), (1, 1.5, 0.1), (1, 0.1, -0.1)])
def test_invalid_regime(c: float, rho: float, r: float) -> None:
    with pytest.raises(PlanningError):
        Regime(c, rho, r)


def _policy(**kw: float) -> Settings:
    return B200.model_copy(update={"policy": PolicyParams(**kw)})  # type: ignore[arg-type]


def test_planner_initial_then_hold() -> None:
    planner = Planner(B200, PAPER_CANDIDATES)
    first = planner.step(0.0, OPEN_CHAT)
    assert first.action == "initial" and first.current.precision == "nvfp4"
    again = planner.step(60.0, OPEN_CHAT)
    assert again.action == "hold" and again.current == first.current


def test_planner_needs_confirmations_and_respects_dwell() -> None:
    start = TierConfig("fp16", False, False)
    planner = Planner(_policy(dwell_s=1800, confirmations=3), PAPER_CANDIDATES, start, 0.0)
    # Inside the dwell nothing moves, however large the gain.
    held = planner.step(600.0, OPEN_CHAT)
    assert held.action == "hold" and "dwell" in held.note
    steps = [planner.step(1800.0 + 60.0 * i, OPEN_CHAT) for i in range(1, 4)]
    assert [s.action for s in steps] == ["pending", "pending", "switch"]
    assert planner.current == TierConfig("nvfp4", False, False)
    assert planner.last_switch == 1980.0
    # Right after a switch the dwell applies again.
    assert planner.step(2000.0, Regime(256, 0.9, 0.6)).action in {"hold"}


def test_planner_pending_resets_when_candidate_changes() -> None:
    planner = Planner(
        _policy(dwell_s=0, confirmations=2), ("fp16",), TierConfig("fp16", False, False)
    )
    copying = Regime(32, 0.9, 0.9)  # s and k both pay at fp16
    assert planner.step(1.0, copying).action == "pending"
    assert planner.step(2.0, Regime(32, 0.0, 0.0)).action == "hold"  # plan == current
    assert planner.step(3.0, copying).action == "pending"
    assert planner.step(4.0, copying).action == "switch"


def test_planner_hysteresis() -> None:
    # A toggle whose gain is under h does not trigger a restart.
    current = TierConfig("nvfp4", False, False)
    planner = Planner(_policy(dwell_s=0, confirmations=1, hysteresis=0.10), ("nvfp4",), current)
    small_gain = Regime(256, 0.60, 0.0)  # rho just above rho* = 0.512
    step = planner.step(10.0, small_gain)
    assert step.plan.prefix_caching and step.action == "hold" and "hysteresis" in step.note
    assert planner.current == current


def test_unmeasured_toggle_stays_as_the_tier_runs_it() -> None:
    # rho and r both high enough to turn both flags on at fp16 (see the pending test above).
    copying = Regime(32, 0.9, 0.9)
    both = plan_tier(copying, B200, ("fp16",))
    assert both.speculative and both.prefix_caching
    running = TierConfig("fp16", False, False)
    no_rho = Regime(32, 0.0, 0.9, rho_known=False)
    plan = plan_tier(no_rho, B200, ("fp16",), current=running)
    assert plan.speculative and not plan.prefix_caching  # r measured, rho not: kept off
    reason = next(r for r in plan.reasons if r.startswith("prefix caching"))
    assert "not measured yet" in reason and "kept as in the current configuration" in reason
    kept_on = plan_tier(no_rho, B200, ("fp16",), current=TierConfig("fp16", False, True))
    assert kept_on.prefix_caching  # 0 would turn it off: the stand-in is not evidence
    # Nothing runs yet (offline planning): the stand-in 0 decides, and the reason says so.
    fresh = plan_tier(Regime(32, 0.9, 0.0, r_known=False), B200, ("fp16",))
    assert not fresh.speculative and fresh.prefix_caching
    assert any("r taken as 0" in r for r in fresh.reasons)


def test_following_planner_measures_against_the_running_flags() -> None:
    copying = Regime(32, 0.9, 0.9)
    planner = Planner(_policy(dwell_s=600, confirmations=2, hysteresis=0.05), ("fp16",))
    running = TierConfig("fp16", False, False)
    planner.follow(running, 0.0)
    assert planner.last_switch is None  # deployed before it was watched: no dwell
    first = planner.step(10.0, copying)
    assert first.action == "pending" and first.plan.config == TierConfig("fp16", True, True)
    # Until confirmed, the advice is what runs, described under this regime.
    assert first.advice.config == running and first.advice.reasons[0].startswith("held:")
    assert first.advice.expected_cpt > first.plan.expected_cpt
    planner.follow(running, 20.0)
    second = planner.step(20.0, copying)
    assert second.action == "switch" and second.advice.config == second.plan.config
    # The switch is advice: the planner keeps measuring against what runs, and the advice
    # stands (no new round of confirmations) until the tier is restarted with it.
    assert planner.current == running
    planner.follow(running, 30.0)
    assert planner.step(30.0, copying).action == "switch"
    applied = TierConfig("fp16", True, True)
    planner.follow(applied, 40.0)
    assert planner.last_switch == 40.0
    held = planner.step(40.0, copying)
    assert held.action == "hold" and held.advice.config == applied
    # The dwell counts from the observed restart: a reversal right after it waits.
    planner.follow(applied, 100.0)
    quiet = planner.step(100.0, Regime(32, 0.0, 0.0))
    assert quiet.action == "hold" and "dwell" in quiet.note
    assert quiet.advice.config == applied


def test_an_infeasible_current_is_switched_without_hysteresis() -> None:
    # The running fp8 (Q 0.995) is below a 0.999 floor and cheaper than fp16, in the dwell: the
    # floor is a constraint, so neither the cost gain, the dwell nor confirmations hold it.
    planner = Planner(_policy(dwell_s=600, confirmations=3), ("fp8", "fp16"), q_min=0.999)
    planner.follow(TierConfig("fp8", False, False), 0.0)
    planner.follow(TierConfig("fp8", False, False), 1.0)
    step = planner.step(10.0, OPEN_CHAT)
    assert step.action == "switch" and "not feasible" in step.note
    assert step.advice.config == step.plan.config and step.plan.precision == "fp16"
    assert step.current_cpt < step.plan.expected_cpt


def test_unmeasured_r_keeps_speculation_without_a_batch_cutoff() -> None:
    settings = settings_from_mapping({"serve": {"batch_dependent_speculation": True}})
    speculating = TierConfig("fp16", True, False)
    plan = plan_tier(Regime(32, 0.0, 0.0, r_known=False), settings, ("fp16",), speculating)
    assert plan.speculative  # r 0 would turn it off: the stand-in is not evidence
    spec = plan.vllm_args[plan.vllm_args.index("--speculative-config") + 1]
    assert "num_speculative_tokens_per_batch_size" not in spec  # a cutoff needs r
    assert any(r.startswith("speculation on: r not measured yet") for r in plan.reasons)


def test_confirmed_advice_stands_through_a_dip_inside_the_hysteresis_band() -> None:
    planner = Planner(_policy(dwell_s=0, confirmations=2, hysteresis=0.05), ("fp16",))
    running = TierConfig("fp16", False, False)
    pays = Regime(32, 0.0, 0.9)  # speculation pays well
    steps = []
    for i, regime in enumerate([pays, pays, Regime(32, 0.0, 0.10), pays]):
        planner.follow(running, 10.0 * i)
        steps.append(planner.step(10.0 * i, regime))
    # The third regime still plans speculation, but gains less than h (2 %) over what runs.
    assert steps[2].plan.speculative
    assert 0.95 * steps[2].current_cpt < steps[2].plan.expected_cpt < steps[2].current_cpt
    assert [s.action for s in steps] == ["pending", "switch", "switch", "switch"]
    assert all(s.advice.speculative for s in steps[1:])


def test_first_follow_forgets_what_the_planner_assumed_before() -> None:
    planner = Planner(_policy(dwell_s=600, confirmations=2), ("fp16",))
    first = planner.step(60.0, Regime(32, 0.0, 0.0))  # before any scrape: offline
    assert first.action == "initial" and planner.last_switch == 60.0
    planner.follow(first.plan.config, 75.0)  # it runs what was advised, since before 60 s
    assert planner.last_switch is None
    step = planner.step(80.0, Regime(32, 0.0, 0.9))
    assert step.action == "pending" and "dwell" not in step.note


def test_held_advice_describes_a_running_precision_outside_the_candidates() -> None:
    planner = Planner(_policy(dwell_s=0, confirmations=3), PAPER_CANDIDATES)
    running = TierConfig("bf16", False, False)  # feasible, not among the candidates
    planner.follow(running, 0.0)
    step = planner.step(10.0, OPEN_CHAT)
    assert step.action == "pending" and step.plan.precision == "nvfp4"
    assert step.advice.config == running  # not the unconfirmed candidate


TIGHT = settings_from_mapping({"cost": {"gpu_memory_fraction": 0.3}})  # 57.6 GB on a B200


def test_a_precision_whose_weights_do_not_fit_is_infeasible() -> None:
    """K = 0 (BF16's 61 GB in a 57.6 GB budget) divided by zero in B_eff; it is dropped
    with a note, and a regime where nothing fits is a PlanningError."""
    plan = plan_tier(Regime(32, 0.1, 0.1), TIGHT)
    assert plan.precision == "nvfp4"
    assert any("bf16 (weights do not fit: K = 0" in r for r in plan.reasons)
    with pytest.raises(PlanningError, match="weights do not fit"):
        plan_tier(Regime(32, 0.1, 0.1), TIGHT, ["bf16"])
    huge_ctx = settings_from_mapping({"cost": {"l_ctx": 100_000_000}})
    with pytest.raises(PlanningError, match="no feasible precision"):
        plan_tier(Regime(32, 0.1, 0.1), huge_ctx)


def test_a_running_precision_that_does_not_fit_is_switched_away_at_once() -> None:
    planner = Planner(TIGHT, current=TierConfig("bf16", False, True), last_switch=0.0)
    step = planner.step(10.0, Regime(32, 0.1, 0.1))
    assert step.action == "switch" and step.plan.precision != "bf16"
    assert math.isinf(step.current_cpt)


@pytest.mark.parametrize(
    ("regime", "says"),
    [
        ({"concurrency": math.inf, "rho": 0.3, "r": 0.3}, "finite"),
        ({"concurrency": math.nan, "rho": 0.3, "r": 0.3}, "finite"),
        ({"concurrency": 256, "rho": 0.3, "r": 0.3, "l_in": 0.0}, "L_in must be a length > 0"),
        ({"concurrency": 256, "rho": math.nan, "r": 0.3}, "rho"),
    ],
)
def test_a_regime_that_cannot_be_costed_is_rejected(regime: dict[str, float], says: str) -> None:
    """C = inf reached the JSON as Infinity; L_in = 0 divided by zero in rho*."""
    with pytest.raises(PlanningError, match=says):
        Regime(**regime)  # type: ignore[arg-type]


def test_a_quality_floor_outside_zero_one_is_rejected() -> None:
    with pytest.raises(PlanningError, match="Q_min"):
        plan_tier(Regime(32, 0.1, 0.1), B200, q_min=math.nan)


def test_fixed_precision_settings_drop_only_the_precision_filters() -> None:
    strict = settings_from_mapping(
        {"hardware": "h200", "cost": {"q_min": 0.99}, "policy": {"require_native_compute": True}}
    )
    with pytest.raises(PlanningError):
        plan_tier(Regime(32, 0.1, 0.1), strict, ["nvfp4"])
    relaxed = fixed_precision_settings(strict)
    assert plan_tier(Regime(32, 0.1, 0.1), relaxed, ["nvfp4"]).precision == "nvfp4"
    assert relaxed.cost.l_ctx == strict.cost.l_ctx and relaxed.hardware == strict.hardware
    with pytest.raises(PlanningError, match="weights do not fit"):
        plan_tier(Regime(32, 0.1, 0.1), fixed_precision_settings(TIGHT), ["bf16"])


def test_an_evaluation_held_by_hysteresis_breaks_the_run_of_confirmations() -> None:
    """N confirmations are N consecutive wins: a candidate held back in between (its gain
    dipped under h) starts its count again."""
    running = TierConfig("fp16", False, False)
    planner = Planner(_policy(dwell_s=0, confirmations=2, hysteresis=0.05), ("fp16",), running)
    pays, dips = Regime(32, 0.0, 0.9), Regime(32, 0.0, 0.10)
    actions = [planner.step(float(t), regime).action for t, regime in enumerate([pays, dips, pays])]
    assert actions == ["pending", "hold", "pending"]
    assert planner.current == running
    assert planner.step(3.0, pays).action == "switch"


def test_confirmed_advice_does_not_carry_over_to_a_different_candidate() -> None:
    """Following, confirmed advice stands while it stays the plan; when the plan moves to
    another configuration that one needs its own confirmations."""
    planner = Planner(_policy(dwell_s=0, confirmations=2, hysteresis=0.05), ("fp16",))
    running = TierConfig("fp16", False, False)
    speculate, cache = Regime(32, 0.0, 0.9), Regime(32, 0.9, 0.0)
    steps = []
    for t, regime in enumerate([speculate, speculate, cache, cache]):
        planner.follow(running, float(t))
        steps.append(planner.step(float(t), regime))
    assert [s.action for s in steps] == ["pending", "switch", "pending", "switch"]
    assert steps[2].plan.config == TierConfig("fp16", False, True)
    assert steps[2].advice.config == running  # not yet confirmed: what runs stays the advice


def test_the_dwell_holds_up_to_and_including_its_last_second() -> None:
    start = TierConfig("fp16", False, False)
    planner = Planner(_policy(dwell_s=600, confirmations=1), PAPER_CANDIDATES, start, 0.0)
    assert planner.step(600.0, OPEN_CHAT).action == "hold"  # "more than the dwell ago"
    assert planner.step(600.5, OPEN_CHAT).action == "switch"


def test_a_precision_exactly_at_the_quality_floor_is_feasible() -> None:
    """b.1 keeps p with Q(p) >= Q_min: a floor equal to nvfp4's Q keeps it."""
    q_nvfp4 = B200.cost.quality["nvfp4"]
    assert plan_tier(OPEN_CHAT, B200, PAPER_CANDIDATES, q_min=q_nvfp4).precision == "nvfp4"
    above = plan_tier(OPEN_CHAT, B200, PAPER_CANDIDATES, q_min=q_nvfp4 + 1e-6)
    assert above.precision != "nvfp4"
