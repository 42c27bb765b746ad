"""The P0 cost model against COST_MODEL.md a.3/a.4 and its stated properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from gateway.planner.costmodel import CostModel, accepted_per_round, inverse_accepted_per_round
from gateway.planner.params import CostParams, Extensions
from gateway.precision import Precision

TIERS: tuple[Precision, ...] = ("fp16", "fp8", "w4a16", "nvfp4")
P0 = CostModel.p0()


def test_kv_and_weights() -> None:
    assert P0.kv_bytes_per_token == 98_304
    assert P0.params.l_ctx * P0.kv_bytes_per_token == 402_653_184
    assert P0.weight_bytes("fp16") == pytest.approx(61.0e9)
    assert P0.weight_bytes("fp8") == pytest.approx(30.5e9)
    assert P0.weight_bytes("nvfp4") == pytest.approx(15.25e9)
    assert P0.weight_bytes("bf16") == P0.weight_bytes("fp16")


def test_knees_b200_and_h200() -> None:
    assert [P0.knee(p) for p in TIERS] == [325, 401, 438, 438]
    assert P0.knee("nvfp4") / P0.knee("fp16") == pytest.approx(1.3477, abs=1e-4)
    h200 = CostModel.preset("h200")
    assert [h200.knee(p) for p in TIERS] == [198, 274, 312, 312]
    assert h200.precision_ratio(1024) == pytest.approx(0.1587, abs=1e-4)


def test_x4_vllm_budget_knees() -> None:
    budget = CostParams(gpu_memory_fraction=0.92, reserve_bytes=4e9)
    b200 = CostModel.preset("b200", params=budget)
    h200 = CostModel.preset("h200", params=budget)
    assert [b200.knee(p) for p in TIERS] == [277, 353, 390, 390]
    assert b200.knee("nvfp4") / b200.knee("fp16") == pytest.approx(1.408, abs=1e-3)
    assert b200.precision_ratio(1024) == pytest.approx(0.178, abs=1e-3)
    assert [h200.knee(p) for p in TIERS] == [160, 236, 274, 274]
    assert h200.precision_ratio(1024) == pytest.approx(0.146, abs=1e-3)


def test_decode_and_prefill_constants() -> None:
    assert P0.decode_step_seconds("fp16") == pytest.approx(0.825e-3)
    assert P0.decode_step_seconds("fp8") == pytest.approx(0.4125e-3)
    assert P0.decode_step_seconds("nvfp4") == pytest.approx(0.20625e-3)
    assert P0.prefill_seconds_per_token("fp16") == pytest.approx(5.8667e-6, rel=1e-4)
    assert P0.gamma == pytest.approx(5.8667e-9, rel=1e-4)
    assert P0.t0_seconds == pytest.approx(12.375e-6)


def test_rho_star_exact() -> None:
    assert P0.rho_star("fp16", 32) == pytest.approx(0.064, abs=1e-12)
    assert P0.rho_star("fp16", 256) == pytest.approx(0.512, abs=1e-12)
    # rho* depends on p only through B_eff.
    assert P0.rho_star("nvfp4", 256) == P0.rho_star("fp16", 256)


@pytest.mark.parametrize(
    ("p", "c", "expected"),
    [
        ("fp16", 32, 0.0600),
        ("fp16", 256, 0.2900),
        ("nvfp4", 32, 0.1406),
        ("nvfp4", 256, 0.4480),
        ("fp8", 32, 0.0812),
        ("fp8", 256, 0.3308),
    ],
)
def test_r_star_a3(p: Precision, c: int, expected: float) -> None:
    assert P0.r_star(p, c) == pytest.approx(expected, abs=5e-5)


def test_r_star_full_table() -> None:
    # The self-check's r*(p, C) table, C = 1, 32, 256, 1024.
    table: dict[Precision, tuple[float, ...]] = {
        "fp16": (0.0163, 0.0600, 0.2900, 0.3412),
        "fp8": (0.0340, 0.0812, 0.3308, 0.4411),
        "w4a16": (0.0773, 0.1309, 0.4170, 0.5732),
        "nvfp4": (0.0830, 0.1406, 0.4480, 0.6159),
    }
    for p, row in table.items():
        got = [round(P0.r_star(p, c), 4) for c in (1, 32, 256, 1024)]
        assert got == list(row), p


def test_r_star_paper_targets() -> None:
    assert abs(P0.r_star("nvfp4", 32) - 0.14) <= 0.002
    assert abs(P0.r_star("nvfp4", 256) - 0.45) <= 0.002


def test_spec_inflation_a3() -> None:
    assert P0.spec_step_inflation("fp16", 32) == pytest.approx(1.063832, abs=1e-6)
    assert P0.spec_step_inflation("fp16", 256) == pytest.approx(1.405656, abs=1e-6)
    assert P0.spec_step_inflation("nvfp4", 32) == pytest.approx(1.108832, abs=1e-6)
    assert P0.spec_step_inflation("fp8", 256) == pytest.approx(1.420656, abs=1e-6)
    assert accepted_per_round(0.06, 4) == pytest.approx(1.063829, abs=1e-6)
    assert accepted_per_round(0.29, 4) == pytest.approx(1.405562, abs=1e-6)


def test_precision_ratio_phases() -> None:
    for c in (1, 32, 256, 325):
        assert abs(P0.precision_ratio(c) - 0.25) < 1e-12
    assert P0.precision_ratio(400) == pytest.approx(0.2031, abs=1e-4)
    assert P0.precision_ratio(360) == pytest.approx(0.2257, abs=1e-4)
    plateau = P0.precision_ratio(438)
    assert plateau == pytest.approx(0.1855, abs=1e-4)
    assert abs(plateau - 0.188) <= 0.003
    assert P0.precision_ratio(1024) == plateau
    # Between the knees the gain is exactly linear in C: gain = 4C / 325.
    for c in range(326, 438):
        assert 1.0 / P0.precision_ratio(c) == pytest.approx(4.0 * c / 325.0, rel=1e-12)
    chord = max(
        abs(P0.precision_ratio(c) - (0.25 + (plateau - 0.25) * (c - 325) / (438 - 325)))
        for c in range(325, 439)
    )
    assert chord == pytest.approx(0.0048, abs=1e-4)


def test_b1_notes_example() -> None:
    # C = 256, r = 0.30: speculation pays at FP16, loses at NVFP4, +15 % decode if inherited.
    fp16_plain = P0.decode_seconds_per_token(256, "fp16")
    fp16_spec = P0.spec_decode_seconds_per_token(256, "fp16", 0.30)
    assert (fp16_plain * 1e6, fp16_spec * 1e6) == pytest.approx((3.223, 3.179), abs=1e-3)
    nv_plain = P0.decode_seconds_per_token(256, "nvfp4")
    nv_spec = P0.spec_decode_seconds_per_token(256, "nvfp4", 0.30)
    assert (nv_plain * 1e6, nv_spec * 1e6) == pytest.approx((0.806, 0.924), abs=1e-3)
    assert nv_spec / nv_plain == pytest.approx(1.15, abs=0.005)


@pytest.mark.parametrize(
    "row",
    [
        (8, 0.00, 0.05, 0, 0, 49.248, 126.592),
        (32, 0.30, 0.20, 1, 1, 24.078, 49.248),
        (256, 0.30, 0.20, 0, 0, 24.272, 26.689),
        (256, 0.60, 0.50, 1, 1, 22.166, 26.689),
        (1024, 0.90, 0.60, 0, 1, 23.374, 26.005),
    ],
)
def test_cpt_demo_rows(row: tuple[int, float, float, int, int, float, float]) -> None:
    # COST_MODEL.md a.6 decide() rows: (C, rho, r, s, k, CPT at NVFP4, CPT at FP16 s=k=0).
    c, rho, r, s, k, cpt_us, fp16_us = row
    assert P0.cpt(c, rho, r, "nvfp4", s, k) * 1e6 == pytest.approx(cpt_us, abs=1e-3)
    assert P0.cpt(c, rho, r, "fp16", 0, 0) * 1e6 == pytest.approx(fp16_us, abs=1e-3)


def _rho_root(model: CostModel, c: float, l_in: float, l_out: float) -> float:
    def gap(rho: float) -> float:
        on = model.cpt(c, rho, 0.0, "fp16", 0, 1, l_in=l_in, l_out=l_out)
        return on - model.cpt(c, rho, 0.0, "fp16", 0, 0, l_in=l_in, l_out=l_out)

    return float(brentq(gap, 0.0, 50.0, xtol=1e-14))


@pytest.mark.parametrize("c", [32, 256, 1024])
def test_rho_star_by_root_finding(c: int) -> None:
    roots = [_rho_root(P0, c, 2048, l_out) for l_out in (64, 512, 4096)]
    for root in roots:
        assert root == pytest.approx(P0.rho_star("fp16", c), rel=1e-9)
    assert _rho_root(P0, c, 4096, 512) == pytest.approx(roots[1] / 2, rel=1e-9)


@given(st.floats(1.0, 325.0), st.floats(1.0, 325.0))
@settings(max_examples=50, deadline=None)
def test_rho_star_proportional_to_b_eff(c1: float, c2: float) -> None:
    assert P0.rho_star("fp16", c1) * c2 == pytest.approx(P0.rho_star("fp16", c2) * c1, rel=1e-12)


@pytest.mark.parametrize("p", TIERS)
@pytest.mark.parametrize("c", [1, 32, 256, 1024])
def test_r_star_by_root_finding(p: Precision, c: int) -> None:
    def gap(r: float) -> float:
        return P0.cpt(c, 0.0, r, p, 1, 0) - P0.cpt(c, 0.0, r, p, 0, 0)

    eta = P0.eta(p)
    root = brentq(gap, 0.0, (1.0 - 1e-12) / eta, xtol=1e-14)
    assert root == pytest.approx(P0.r_star(p, c), rel=1e-9)


@given(st.floats(1.0, 2000.0), st.floats(1.0, 2000.0))
@settings(max_examples=80, deadline=None)
def test_r_star_rises_with_concurrency_and_lower_precision(c1: float, c2: float) -> None:
    lo, hi = sorted((c1, c2))
    for p in TIERS:
        assert P0.r_star(p, lo) <= P0.r_star(p, hi) + 1e-12
    for c in (lo, hi):
        values = [P0.r_star(p, c) for p in TIERS]
        assert values == sorted(values)


def test_r_star_infinite_when_overhead_exceeds_max_gain() -> None:
    heavy = CostModel.preset(params=CostParams(beta=0.05))
    assert math.isinf(heavy.r_star("fp16", 1024))


@given(st.floats(0.0, 0.999), st.integers(1, 8))
def test_inverse_acceptance(a: float, k: int) -> None:
    assert inverse_accepted_per_round(accepted_per_round(a, k), k) == pytest.approx(a, abs=1e-9)


def test_x1_x2_extension_ratios() -> None:
    union = CostModel.preset(params=CostParams(extensions=Extensions(expert_union=True)))
    both = CostModel.preset(
        params=CostParams(extensions=Extensions(expert_union=True, kv_read=True))
    )
    expected = {1: 0.277, 32: 0.340, 256: 0.617, 325: 0.662, 438: 0.633, 1024: 0.633}
    for c, ratio in expected.items():
        assert union.precision_ratio(c) == pytest.approx(P0.precision_ratio(c), rel=1e-9)
        assert both.precision_ratio(c) == pytest.approx(ratio, abs=5e-4)
    # X1: streamed params grow 8.7x from B = 1 to B = 32.
    growth = union.decode_step_seconds("fp16", 32) / union.decode_step_seconds("fp16", 1)
    assert growth == pytest.approx(8.7, abs=0.05)


def test_x5_effective_bytes() -> None:
    x5 = CostModel.preset(params=CostParams(extensions=Extensions(effective_bytes=True)))
    assert x5.bytes_per_param("nvfp4") == pytest.approx(0.5625)
    assert x5.bytes_per_param("w4a16") == pytest.approx(0.516, abs=1e-3)
    # Scales and BF16 lm_head make 4-bit tiers cost more than a quarter of BF16.
    assert x5.precision_ratio(1) > 0.281
    assert x5.knee("nvfp4") < P0.knee("nvfp4")


def test_prefill_speedup_extension() -> None:
    fast = CostModel.preset(params=CostParams(extensions=Extensions(prefill_speedup=True)))
    assert fast.rho_star("nvfp4", 32) == pytest.approx(0.002 * 4 * 32)
    assert fast.rho_star("fp8", 32) == pytest.approx(0.002 * 2 * 32)
    h200 = CostModel.preset("h200", params=fast.params)
    assert h200.prefill_seconds_per_token("nvfp4") == h200.prefill_seconds_per_token("bf16")


def test_best_num_speculative_tokens() -> None:
    assert P0.best_num_speculative_tokens("fp16", 32, 0.9) >= 4
    assert P0.best_num_speculative_tokens("nvfp4", 1024, 0.1) == 0


def test_invalid_concurrency() -> None:
    with pytest.raises(ValueError, match="positive"):
        P0.b_eff(0, "fp16")


def test_the_kv_capacity_an_engine_reports_replaces_the_memory_estimate() -> None:
    """b.2 item 4: K(p) = reported KV tokens / L_ctx for the precisions it names."""
    estimate = CostModel.preset()
    measured = CostModel.preset(params=CostParams(kv_capacity_tokens={"fp16": 100 * 4096 + 5}))
    assert measured.knee("fp16") == 100 != estimate.knee("fp16")
    assert measured.knee("nvfp4") == estimate.knee("nvfp4")
    tiny = CostModel.preset(params=CostParams(kv_capacity_tokens={"fp16": 4095}))
    assert not tiny.fits("fp16") and "engine holds 4095 KV tokens" in tiny.fit_problem("fp16")


def test_the_knee_is_capped_by_max_num_seqs() -> None:
    small = CostModel.preset(params=CostParams(max_num_seqs=64))
    for p in TIERS:
        assert P0.knee(p) > 64 and small.knee(p) == 64
        assert small.b_eff(1024, p) == 64.0


def test_cpt_scales_with_the_gpu_price() -> None:
    priced = CostModel.preset(params=CostParams(price_per_gpu_second=2.5))
    for p in TIERS:
        assert priced.cpt(32, 0.5, 0.3, p, True, True) == pytest.approx(
            2.5 * P0.cpt(32, 0.5, 0.3, p, True, True), rel=1e-12
        )


def test_no_tensor_core_speedup_without_native_compute() -> None:
    ampere = P0.hardware.model_copy(update={"name": "sm80", "compute_capability": 80})
    old = CostModel(ampere, P0.model, CostParams(extensions=Extensions(prefill_speedup=True)))
    assert old.compute_speedup("fp8") == 1.0 and old.compute_speedup("nvfp4") == 1.0
    assert old.prefill_seconds_per_token("fp8") == old.prefill_seconds_per_token("bf16")
    assert CostModel.preset("h200").compute_speedup("fp8") == 2.0


def test_x5_streams_the_active_weights_without_the_embedding_gather() -> None:
    """a.5 X5: '3.3B active' includes the embedding, a gather, not a stream: about 3.04e9
    parameters are streamed, lm_head in BF16 and the rest with their scales."""
    x5 = CostModel.preset(params=CostParams(extensions=Extensions(effective_bytes=True)))
    m = x5.model
    assert m.n_active - m.n_embedding == pytest.approx(3.0e9, rel=0.02)
    streamed = x5.decode_step_seconds("nvfp4", 1) * x5.hardware.bandwidth
    expected = (m.n_active - m.n_embedding - m.n_lm_head) * 0.5625 + m.n_lm_head * 2.0
    assert streamed == pytest.approx(expected, rel=1e-12)


def test_x2_request_cost_reads_the_mean_context_l_in_plus_half_l_out() -> None:
    kv = CostModel.preset(params=CostParams(extensions=Extensions(kv_read=True)))
    c = kv.params
    expected = c.l_in * kv.prefill_seconds_per_token("fp16") + c.l_out * (
        kv.decode_step_seconds("fp16", 32, 1.0, c.l_in + c.l_out / 2.0) / 32
    )
    assert kv.request_seconds(32, 0.0, 0.0, "fp16", False, False) == pytest.approx(
        expected, rel=1e-12
    )


def test_breakeven_table_writes_a_never_paying_speculation_as_null() -> None:
    """JSON has no infinity: r* = inf (speculation never pays) is null, not 'Infinity'."""
    import json

    from gateway.planner.breakeven import breakeven_table

    heavy = CostModel.preset(params=CostParams(beta=0.05))
    table = breakeven_table(heavy, concurrencies=(1024,))
    assert table["r_star"]["fp16"]["1024"] is None
    json.dumps(table, allow_nan=False)  # raises on inf or nan


def test_the_best_speculation_length_can_be_the_longest_allowed() -> None:
    """At full acceptance and C = 1 every extra draft token pays, so k_max itself wins."""
    assert P0.best_num_speculative_tokens("fp16", 1, 1.0, k_max=3) == 3


def test_the_expert_union_of_a_step_is_at_least_one_tokens_experts() -> None:
    """X1 below C = 1 (an idle-paid GPU): a step still routes one token, not a fraction."""
    union = CostModel.preset(params=CostParams(extensions=Extensions(expert_union=True)))
    assert union.decode_step_seconds("fp16", 0.5) == union.decode_step_seconds("fp16", 1.0)


def test_under_x1_the_fixed_speculation_cost_is_over_the_plain_step() -> None:
    """R = verify/plain + t0 / t_w(p) + beta k m B: t0 is a share of the plain step (a.2),
    not of the wider verify step the expert union makes slower."""
    union = CostModel.preset(params=CostParams(extensions=Extensions(expert_union=True)))
    c, b = union.params, 8.0
    k, m = c.num_speculative_tokens, c.draft_coverage
    plain = union.decode_step_seconds("fp16", b)
    verify = union.decode_step_seconds("fp16", b, 1.0 + k * m)
    assert verify > plain
    rest = union.spec_step_inflation("fp16", b) - verify / plain - c.beta * k * m * b
    assert rest == pytest.approx(union.t0_seconds / plain, rel=1e-9)
