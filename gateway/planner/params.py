"""Typed, YAML-overridable parameters of the cost model, the vLLM deployment and the planner.

Defaults are the P0 calibration set of COST_MODEL.md a.1 (B200, u = 1, R_res = 0). A YAML
document overrides any subset:

```yaml
hardware: h200                 # a preset name, or a mapping of HardwareSpec fields
model: qwen3-coder-30b-a3b     # a preset name, or a mapping of ModelSpec fields
cost: {l_in: 4096, eta: {nvfp4: 0.65}, extensions: {expert_union: true}}
serve: {gpu_memory_utilization: 0.9, prompt_lookup_min: 3}
policy: {hysteresis: 0.05, dwell_s: 900}
```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.planner.presets import (
    HardwareSpec,
    ModelSpec,
    hardware_preset,
    model_preset,
)
from gateway.precision import Precision

__all__ = [
    "DEFAULT_ETA",
    "DEFAULT_QUALITY",
    "VLLM_KV_CACHE_DTYPES",
    "CostParams",
    "Extensions",
    "PolicyParams",
    "ServeParams",
    "Settings",
    "settings_from_mapping",
    "settings_from_yaml",
]

# a.1: eta(FP8), eta(W4A16) and all Q values are placeholders; eta(NVFP4) is fitted.
DEFAULT_ETA: Final[dict[Precision, float]] = {
    "bf16": 1.0,
    "fp16": 1.0,
    "fp8": 0.90,
    "w4a16": 0.75,
    "nvfp4": 0.698,
}
DEFAULT_QUALITY: Final[dict[Precision, float]] = {
    "bf16": 1.000,
    "fp16": 1.000,
    "fp8": 0.995,
    "w4a16": 0.975,
    "nvfp4": 0.980,
}


class _Frozen(BaseModel):
    # No inf or NaN anywhere: they would reach the plan's JSON, which has neither.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# eta(p) = r_iid(p) / r_iid(reference): an erosion, so in (0, 1] (r* divides by it), and
# a(p) = eta * r stays an acceptance probability. Q(p) is a score on the Q_min scale, [0, 1].
Eta = Annotated[float, Field(gt=0, le=1)]
Quality = Annotated[float, Field(ge=0, le=1)]


class Extensions(_Frozen):
    """Realism switches of COST_MODEL.md a.5; all off reproduces the paper (P0)."""

    expert_union: bool = Field(default=False, description="X1: a step streams the union of experts")
    kv_read: bool = Field(
        default=False, description="X2: a step also reads B * L_bar * kappa bytes"
    )
    effective_bytes: bool = Field(
        default=False, description="X5: scale bytes, BF16 embeddings/lm_head, no embedding stream"
    )
    prefill_speedup: bool = Field(
        default=False, description="a.2 item 7: c_pre(p) = c_pre / phi(p) where compute is native"
    )


class CostParams(_Frozen):
    """Workload and calibration constants of CPT (COST_MODEL.md a.1)."""

    gpu_memory_fraction: float = Field(default=1.0, gt=0, le=1, description="u")
    reserve_bytes: float = Field(default=0.0, ge=0, description="R_res")
    l_ctx: int = Field(
        default=4096, gt=0, description="KV tokens reserved per request (deployment)"
    )
    l_in: float = Field(default=2048.0, gt=0, description="mean prompt tokens")
    l_out: float = Field(default=512.0, gt=0, description="mean output tokens")
    # Bounded: the per-batch speculation table scans every batch size up to it (on the
    # event loop, live); vLLM deployments run hundreds to a few thousand.
    max_num_seqs: int = Field(default=1024, gt=0, le=65536)
    mfu_prefill: float = Field(default=0.5, gt=0, le=1)
    # b.2 item 4: the KV tokens an engine reports it holds (vllm:cache_config_info's
    # num_gpu_blocks x block_size). Where given, K(p) comes from it instead of the X4 memory
    # estimate, which misses activations, CUDA graphs and the real KV dtype.
    kv_capacity_tokens: dict[Precision, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    kv_bytes_per_element: float = Field(
        default=2.0, gt=0, description="b_kv (KV pinned to BF16, X6)"
    )
    gamma_over_c_pre: float = Field(default=0.001, ge=0, description="gamma as a share of c_pre")
    gamma_s: float | None = Field(
        default=None, ge=0, description="absolute gamma; overrides the share"
    )
    num_speculative_tokens: int = Field(default=4, gt=0, description="k_s")
    t0_over_t_w_ref: float = Field(default=0.015, ge=0, description="t0 as a share of t_w(FP16)")
    t0_s: float | None = Field(default=None, ge=0, description="absolute t0; overrides the share")
    beta: float = Field(default=3.815e-4, ge=0)
    draft_coverage: float = Field(
        default=1.0, ge=0, le=1, description="X8: m, share of drafting reqs"
    )
    eta: dict[Precision, Eta] = Field(default_factory=lambda: dict(DEFAULT_ETA))
    quality: dict[Precision, Quality] = Field(default_factory=lambda: dict(DEFAULT_QUALITY))
    q_min: float = Field(default=0.97, ge=0, le=1)
    price_per_gpu_second: float = Field(default=1.0, gt=0, description="pi; 1 gives GPU-seconds")
    extensions: Extensions = Extensions()

    @model_validator(mode="before")
    @classmethod
    def _merge_maps(cls, data: Any) -> Any:
        # A YAML override of one eta or Q entry keeps the other defaults.
        if isinstance(data, dict):
            data = dict(data)
            for key, base in (("eta", DEFAULT_ETA), ("quality", DEFAULT_QUALITY)):
                if isinstance(data.get(key), dict):
                    data[key] = {**base, **data[key]}
        return data


# `--kv-cache-dtype` choices of vLLM (0.32 CLI; 0.33 per COST_MODEL.md d.1): any other name
# renders a `vllm serve` line that vLLM rejects at startup.
VLLM_KV_CACHE_DTYPES: Final[frozenset[str]] = frozenset(
    {
        "auto",
        "bfloat16",
        "float16",
        "fp8",
        "fp8_ds_mla",
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_inc",
        "fp8_per_token_head",
        "int4_per_token_head",
        "int8_per_token_head",
        "nvfp4",
        "nvfp4_4over6",
        "nvfp4_ds_mla",
        "turboquant_3bit_nc",
        "turboquant_4bit_nc",
        "turboquant_k3v4_nc",
        "turboquant_k8v4",
        "ultraquant_4bit",
    }
)


# Bytes per KV element of the plain dtypes (the others carry scales or depend on the model).
_KV_DTYPE_BYTES: Final[dict[str, float]] = {
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
}


class ServeParams(_Frozen):
    """`vllm serve` settings that the cost model does not decide (COST_MODEL.md d)."""

    gpu_memory_utilization: float = Field(
        default=0.92,
        gt=0,
        le=1,
        description="vLLM 0.33 default; P0's u = 1 is an idealisation (X4)",
    )
    block_size: int = Field(default=16, gt=0)
    prompt_lookup_min: int = Field(default=2, gt=0)
    prompt_lookup_max: int = Field(default=4, gt=0)
    kv_cache_dtype: str = Field(default="bfloat16", description="pinned on every tier (X6)")
    batch_dependent_speculation: bool = Field(
        default=False,
        description="emit num_speculative_tokens_per_batch_size to switch k to 0 at the "
        "batch sizes where r does not beat r*(p, B) (d.5; forces PIECEWISE CUDA graphs)",
    )

    @model_validator(mode="after")
    def _check_lookup(self) -> ServeParams:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        if self.kv_cache_dtype not in VLLM_KV_CACHE_DTYPES:
            known = ", ".join(sorted(VLLM_KV_CACHE_DTYPES))
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of vLLM's: {known}"
            )
        return self


# The b.1 loop's window W and period are the live observer's (`observer.window_s`,
# `observer.plan_interval_s`); these names here were accepted and never read.
_MOVED_POLICY_FIELDS: Final = {
    "window_s": "observer.window_s",
    "period_s": "observer.plan_interval_s",
}


class PolicyParams(_Frozen):
    """The b.1 control loop's switching rules: hysteresis h, dwell, confirmations N. Its
    window W and period are the observer's `window_s` and `plan_interval_s`."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, home in _MOVED_POLICY_FIELDS.items():
                if name in data:
                    raise ValueError(f"{name} is not a policy setting: set {home}")
        return data

    hysteresis: float = Field(default=0.10, ge=0, lt=1)
    dwell_s: float = Field(default=1800.0, ge=0)
    confirmations: int = Field(default=3, ge=1)
    require_native_compute: bool = Field(
        default=False, description="drop tiers whose compute is emulated (NVFP4 on SM90)"
    )


class Settings(_Frozen):
    """Everything the planner needs, validated once."""

    hardware: HardwareSpec = Field(default_factory=lambda: hardware_preset("b200"))
    model: ModelSpec = Field(default_factory=lambda: model_preset("qwen3-30b-a3b"))
    cost: CostParams = CostParams()
    serve: ServeParams = ServeParams()
    policy: PolicyParams = PolicyParams()

    @model_validator(mode="before")
    @classmethod
    def _resolve_presets(cls, data: Any) -> Any:
        # `hardware: h200` names a preset; a mapping with `preset:` starts from one.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key, lookup in (("hardware", hardware_preset), ("model", model_preset)):
            if key not in data:
                continue
            try:
                data[key] = cls._with_preset(data[key], lookup)
            except KeyError as exc:
                # An unknown preset name: as a ValueError pydantic reports it as a validation
                # error of `planner`; a KeyError would escape validation as a traceback from
                # `check`, and a reload would die on it instead of being refused.
                raise ValueError(exc.args[0]) from None
        return data

    @staticmethod
    def _with_preset(value: Any, lookup: Callable[[str], BaseModel]) -> Any:
        """`value` with a preset's name (or its `preset:` key) replaced by the preset."""
        if isinstance(value, str):
            return lookup(value)
        if isinstance(value, dict) and "preset" in value:
            rest = {k: v for k, v in value.items() if k != "preset"}
            base = lookup(str(value["preset"])).model_dump()
            if isinstance(base.get("checkpoints"), dict) and isinstance(
                rest.get("checkpoints"), dict
            ):
                # Overriding one tier's checkpoint keeps the preset's others, as for
                # eta and Q: replacing the map would leave those tiers unservable.
                rest["checkpoints"] = {**base["checkpoints"], **rest["checkpoints"]}
            return {**base, **rest}
        return value

    @model_validator(mode="after")
    def _check_kv_bytes(self) -> Settings:
        # X6: the knee is computed with cost.kv_bytes_per_element; a pinned KV dtype of another
        # size would have vLLM hold twice (or half) the requests the plan assumes.
        pinned = _KV_DTYPE_BYTES.get(self.serve.kv_cache_dtype)
        if pinned is not None and pinned != self.cost.kv_bytes_per_element:
            raise ValueError(
                f"serve.kv_cache_dtype {self.serve.kv_cache_dtype} holds {pinned:g} bytes per "
                f"element, cost.kv_bytes_per_element says {self.cost.kv_bytes_per_element:g}: "
                "set both"
            )
        return self


def settings_from_mapping(data: dict[str, Any] | None) -> Settings:
    """Validates a plain mapping (e.g. parsed YAML) into Settings."""
    return Settings.model_validate(data or {})


def settings_from_yaml(text: str) -> Settings:
    """Parses a YAML document into Settings; an empty document gives the defaults."""
    loaded = yaml.safe_load(text)
    if loaded is not None and not isinstance(loaded, dict):
        raise ValueError("planner settings YAML must be a mapping")
    return settings_from_mapping(loaded)
