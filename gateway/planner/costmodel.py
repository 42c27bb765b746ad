"""The analytic serving cost model CPT(C, rho, r; p, s, k) of COST_MODEL.md a.2.

Pure arithmetic on frozen inputs: no I/O, no clocks. Units are SI (bytes, seconds); with the
default price pi = 1, costs are GPU-seconds. Precision "bf16" is costed like "fp16" (same bytes).
The realism extensions X1, X2, X5 and the prefill speed-up are switched by
`CostParams.extensions`; all off reproduces the paper (P0), whose self-check numbers are in a.3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from gateway.observer.acceptance import accepted_per_round, inverse_accepted_per_round
from gateway.planner.params import CostParams, Settings
from gateway.planner.presets import HardwareSpec, ModelSpec, hardware_preset, model_preset
from gateway.precision import BYTES_PER_PARAM, Precision

__all__ = [
    "EFFECTIVE_BYTES_PER_PARAM",
    "CostModel",
    "accepted_per_round",
    "inverse_accepted_per_round",
]

# X5: bytes per parameter including scales. FP8 block-wise 128x128 with an FP32 scale,
# W4A16 group 128 with 16-bit scales, NVFP4 one FP8 scale per 16 values.
EFFECTIVE_BYTES_PER_PARAM: Final[dict[Precision, float]] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0 + 4.0 / (128 * 128),
    "w4a16": 0.5 + 2.0 / 128,
    "nvfp4": 0.5 + 1.0 / 16,
}


@dataclass(frozen=True)
class CostModel:
    """CPT and its breakevens for one model on one GPU type.

    `C` is offered concurrency (requests in flight), `rho` the prefix-share rate, `r` the
    i.i.d.-equivalent n-gram acceptance at reference precision, `s`/`k` the speculation and
    prefix-caching toggles.
    """

    hardware: HardwareSpec
    model: ModelSpec
    params: CostParams = field(default_factory=CostParams)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def p0(cls) -> CostModel:
        """The paper's calibration set: B200, Qwen3-30B-A3B, every extension off."""
        return cls(hardware_preset("b200"), model_preset("qwen3-30b-a3b"), CostParams())

    @classmethod
    def preset(
        cls,
        hardware: str = "b200",
        model: str = "qwen3-30b-a3b",
        params: CostParams | None = None,
    ) -> CostModel:
        """A model from preset names, e.g. `CostModel.preset("h200", "qwen3-coder-30b-a3b")`."""
        return cls(hardware_preset(hardware), model_preset(model), params or CostParams())

    @classmethod
    def from_settings(cls, settings: Settings) -> CostModel:
        return cls(settings.hardware, settings.model, settings.cost)

    # -- memory and the capacity knee (a.2 items 1-4) ------------------------------------

    @property
    def kv_bytes_per_token(self) -> float:
        """kappa = 2 * n_L * n_kv * d_h * b_kv."""
        m = self.model
        return 2.0 * m.n_layers * m.n_kv_heads * m.head_dim * self.params.kv_bytes_per_element

    def bytes_per_param(self, p: Precision) -> float:
        """b(p): nominal, or with scales under X5."""
        if self.params.extensions.effective_bytes:
            return EFFECTIVE_BYTES_PER_PARAM[p]
        return BYTES_PER_PARAM[p]

    def weight_bytes(self, p: Precision) -> float:
        """W(p); under X5 the embedding and lm_head stay BF16."""
        m = self.model
        if self.params.extensions.effective_bytes:
            kept = m.n_embedding + m.n_lm_head
            return (m.n_total - kept) * self.bytes_per_param(p) + kept * 2.0
        return m.n_total * self.bytes_per_param(p)

    def kv_capacity_tokens(self, p: Precision) -> float:
        """KV tokens that fit after the weights: (u * M_HBM - R_res - W(p)) / kappa, or
        what the engine reports (`cost.kv_capacity_tokens`, b.2 item 4)."""
        c = self.params
        measured = c.kv_capacity_tokens.get(p)
        if measured is not None:
            return measured
        free = c.gpu_memory_fraction * self.hardware.hbm_bytes - c.reserve_bytes
        return max(0.0, free - self.weight_bytes(p)) / self.kv_bytes_per_token

    def knee(self, p: Precision) -> int:
        """K(p) = min(max_num_seqs, floor(KV capacity / L_ctx))."""
        per_request = math.floor(self.kv_capacity_tokens(p) / self.params.l_ctx)
        return min(self.params.max_num_seqs, per_request)

    def fits(self, p: Precision) -> bool:
        """Whether one request's L_ctx of KV fits next to the weights (K(p) >= 1)."""
        return self.knee(p) >= 1

    def b_eff(self, concurrency: float, p: Precision) -> float:
        """B_eff(C, p) = min(C, K(p)). C below 1 is allowed: the GPU is then paid while idle,
        so cost per token rises as 1/C. A precision that does not fit has no batch at all."""
        if concurrency <= 0:
            raise ValueError("concurrency must be positive")
        if not self.fits(p):
            raise ValueError(f"{p} does not fit: {self.fit_problem(p)}")
        return min(float(concurrency), float(self.knee(p)))

    def fit_problem(self, p: Precision) -> str:
        """Why K(p) is 0, in numbers (for notes and errors)."""
        c = self.params
        measured = c.kv_capacity_tokens.get(p)
        if measured is not None:
            return (
                f"K = 0, the engine holds {measured:.0f} KV tokens, fewer than one "
                f"request's L_ctx {c.l_ctx}"
            )
        budget = c.gpu_memory_fraction * self.hardware.hbm_bytes - c.reserve_bytes
        per_request = c.l_ctx * self.kv_bytes_per_token
        return (
            f"K = 0, weights {self.weight_bytes(p) / 1e9:.1f} GB + one request's KV "
            f"{per_request / 1e9:.2f} GB (L_ctx {c.l_ctx}) exceed the "
            f"{budget / 1e9:.1f} GB budget"
        )

    # -- decode (a.2 items 5, 6, 8; X1, X2, X5) ------------------------------------------

    def _streamed_weight_bytes(self, p: Precision, tokens: float) -> float:
        m, ext = self.model, self.params.extensions
        b = self.bytes_per_param(p)
        if ext.expert_union:
            # X1: a step touches the union of the experts its tokens route to.
            miss = 1.0 - m.experts_per_token / m.n_experts
            experts = m.n_expert_total * (1.0 - math.pow(miss, max(tokens, 1.0)))
            dense = m.n_non_expert
        else:
            experts = 0.0
            dense = m.n_active
            if ext.effective_bytes:
                dense -= m.n_embedding  # the embedding is a gather, not a stream
        if ext.effective_bytes:
            # lm_head stays BF16; the rest carries the scale overhead.
            return (dense - m.n_lm_head + experts) * b + m.n_lm_head * 2.0
        return (dense + experts) * b

    def decode_step_seconds(
        self,
        p: Precision,
        batch: float = 1.0,
        tokens_per_request: float = 1.0,
        mean_context: float | None = None,
    ) -> float:
        """t_w(p): one decode step for `batch` requests, each with `tokens_per_request` query
        tokens. In P0 it streams the active weights once and depends on p only; X1 makes it
        grow with the tokens in the step, X2 adds the KV read of `mean_context` tokens per
        request (default L_in + L_out / 2)."""
        total = self._streamed_weight_bytes(p, batch * tokens_per_request)
        if self.params.extensions.kv_read:
            context = (
                mean_context
                if mean_context is not None
                else self.params.l_in + self.params.l_out / 2.0
            )
            total += batch * context * self.kv_bytes_per_token
        return total / self.hardware.bandwidth

    def decode_seconds_per_token(
        self, concurrency: float, p: Precision, mean_context: float | None = None
    ) -> float:
        """tau_dec(p) = t_w(p) / B_eff without speculation (D[p] of b.1)."""
        b = self.b_eff(concurrency, p)
        return self.decode_step_seconds(p, b, 1.0, mean_context) / b

    @property
    def t0_seconds(self) -> float:
        """Fixed per-step cost of speculation; P0 puts it at 0.015 * t_w(FP16), nominal bytes."""
        c = self.params
        if c.t0_s is not None:
            return c.t0_s
        reference = self.model.n_active * BYTES_PER_PARAM["fp16"] / self.hardware.bandwidth
        return c.t0_over_t_w_ref * reference

    def spec_step_inflation(
        self,
        p: Precision,
        b_eff: float,
        k_s: int | None = None,
        mean_context: float | None = None,
    ) -> float:
        """R(p, B) = 1 + t0 / t_w(p) + beta * k_s * m * B; under X1 the verify tokens also
        widen the expert union, which enters as the ratio of the two step times."""
        c = self.params
        k = c.num_speculative_tokens if k_s is None else k_s
        m = c.draft_coverage
        plain = self.decode_step_seconds(p, b_eff, 1.0, mean_context)
        verify = self.decode_step_seconds(p, b_eff, 1.0 + k * m, mean_context)
        return verify / plain + self.t0_seconds / plain + c.beta * k * m * b_eff

    @staticmethod
    def accepted_per_round(a: float, k_s: int) -> float:
        """A(a, k_s); see the module-level function."""
        return accepted_per_round(a, k_s)

    def eta(self, p: Precision) -> float:
        return self.params.eta[p]

    def quality(self, p: Precision) -> float:
        return self.params.quality[p]

    def native_compute(self, p: Precision) -> bool:
        """False where vLLM emulates the format: FP8 below SM89, NVFP4 below SM100 (Marlin)."""
        if p == "fp8":
            return self.hardware.native_fp8
        if p == "nvfp4":
            return self.hardware.native_fp4
        return True

    def spec_decode_seconds_per_token(
        self, concurrency: float, p: Precision, r: float, mean_context: float | None = None
    ) -> float:
        """tau_dec^s(p) = t_w(p) * R(p, B_eff) / (B_eff * A(eta(p) * r, k_s))."""
        b = self.b_eff(concurrency, p)
        k = self.params.num_speculative_tokens
        step = self.decode_step_seconds(p, b, 1.0, mean_context)
        inflation = self.spec_step_inflation(p, b, k, mean_context)
        return step * inflation / (b * accepted_per_round(self.eta(p) * r, k))

    # -- prefill and prefix caching (a.2 items 7, 9, 11) ---------------------------------

    def compute_speedup(self, p: Precision) -> float:
        """phi(p): tensor-core speed-up over BF16 where the hardware computes in p natively
        (FP8 2x from SM89, NVFP4 4x from SM100); 1 for weight-only formats."""
        if p == "fp8" and self.hardware.native_fp8:
            return 2.0
        if p == "nvfp4" and self.hardware.native_fp4:
            return 4.0
        return 1.0

    def _prefill_speedup(self, p: Precision) -> float:
        # a.2 item 7: only with the extension on; P0 keeps c_pre precision-independent.
        if not self.params.extensions.prefill_speedup:
            return 1.0
        return self.compute_speedup(p)

    def _c_pre_reference(self) -> float:
        return 2.0 * self.model.n_active / (self.hardware.bf16_flops * self.params.mfu_prefill)

    def prefill_seconds_per_token(self, p: Precision) -> float:
        """c_pre = 2 * N_act / (F16 * MFU_pre), divided by phi(p) under the extension."""
        return self._c_pre_reference() / self._prefill_speedup(p)

    @property
    def gamma(self) -> float:
        """APC management cost per reserved context token per co-resident request (s)."""
        c = self.params
        return c.gamma_s if c.gamma_s is not None else c.gamma_over_c_pre * self._c_pre_reference()

    # -- the cost per output token (a.2 items 9, 10) -------------------------------------

    def request_seconds(  # noqa: PLR0917 - mirrors CPT(C, rho, r; p, s, k)
        self,
        concurrency: float,
        rho: float,
        r: float,
        p: Precision,
        s: bool | int,
        k: bool | int,
        *,
        l_in: float | None = None,
        l_out: float | None = None,
    ) -> float:
        """T_req: GPU-seconds per request."""
        c = self.params
        li = c.l_in if l_in is None else l_in
        lo = c.l_out if l_out is None else l_out
        ctx = li + lo / 2.0
        b = self.b_eff(concurrency, p)
        cache = 1.0 if k else 0.0
        prefill = self.prefill_seconds_per_token(p) * li * (1.0 - cache * rho)
        management = cache * self.gamma * c.l_ctx * b
        per_token = (
            self.spec_decode_seconds_per_token(concurrency, p, r, ctx)
            if s
            else self.decode_seconds_per_token(concurrency, p, ctx)
        )
        return prefill + management + lo * per_token

    def cpt(  # noqa: PLR0917 - mirrors CPT(C, rho, r; p, s, k)
        self,
        concurrency: float,
        rho: float,
        r: float,
        p: Precision,
        s: bool | int,
        k: bool | int,
        *,
        l_in: float | None = None,
        l_out: float | None = None,
    ) -> float:
        """CPT = pi * T_req / L_out (GPU-seconds per output token at pi = 1)."""
        lo = self.params.l_out if l_out is None else l_out
        t_req = self.request_seconds(concurrency, rho, r, p, s, k, l_in=l_in, l_out=l_out)
        return self.params.price_per_gpu_second * t_req / lo

    # -- breakevens (a.2 items 11-13) ----------------------------------------------------

    def rho_star_at_batch(self, b_eff: float, p: Precision, l_in: float | None = None) -> float:
        """rho* = gamma * L_ctx * B_eff / (c_pre(p) * L_in)."""
        li = self.params.l_in if l_in is None else l_in
        return self.gamma * self.params.l_ctx * b_eff / (self.prefill_seconds_per_token(p) * li)

    def rho_star(self, p: Precision, concurrency: float, l_in: float | None = None) -> float:
        """Prefix caching pays when rho > rho*(p, B_eff(C, p)); independent of L_out."""
        return self.rho_star_at_batch(self.b_eff(concurrency, p), p, l_in)

    def r_star_at_batch(
        self, b_eff: float, p: Precision, mean_context: float | None = None
    ) -> float:
        """r* = A^-1(R(p, B); k_s) / eta(p); infinite when R >= k_s + 1."""
        k = self.params.num_speculative_tokens
        inflation = self.spec_step_inflation(p, b_eff, k, mean_context)
        if inflation >= k + 1:
            return math.inf
        return inverse_accepted_per_round(inflation, k) / self.eta(p)

    def r_star(self, p: Precision, concurrency: float, mean_context: float | None = None) -> float:
        """Speculation pays when r > r*(p, C)."""
        return self.r_star_at_batch(self.b_eff(concurrency, p), p, mean_context)

    def precision_ratio(
        self, concurrency: float, low: Precision = "nvfp4", high: Precision = "fp16"
    ) -> float:
        """Decode cost of `low` over `high` at C, without speculation (a.2 item 13)."""
        return self.decode_seconds_per_token(concurrency, low) / self.decode_seconds_per_token(
            concurrency, high
        )

    def best_num_speculative_tokens(
        self, p: Precision, concurrency: float, r: float, k_max: int = 8
    ) -> int:
        """X9: argmax_k A(eta r, k) / R(p, B, k); 0 when no k beats plain decode."""
        b = self.b_eff(concurrency, p)
        a = self.eta(p) * r
        best_k, best_gain = 0, 1.0
        for k in range(1, k_max + 1):
            gain = accepted_per_round(a, k) / self.spec_step_inflation(p, b, k)
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k
