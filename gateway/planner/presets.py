"""Hardware and model presets for the cost model (COST_MODEL.md a.1, a.5, d).

Presets are plain pydantic models so that a YAML file can override any field; the named
instances below are the calibration set P0 (B200) and the uncalibrated H200 twin.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.precision import Precision

__all__ = [
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "Checkpoint",
    "HardwareSpec",
    "ModelSpec",
    "hardware_preset",
    "model_preset",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class HardwareSpec(_Frozen):
    """One GPU. Units: bytes, bytes/s, FLOP/s."""

    name: str
    hbm_bytes: float = Field(gt=0)
    bandwidth: float = Field(gt=0, description="HBM bandwidth, B/s")
    bf16_flops: float = Field(gt=0, description="dense BF16 tensor throughput, FLOP/s")
    compute_capability: int = Field(description="SM version times ten, e.g. 90 for H200")

    @property
    def native_fp8(self) -> bool:
        # W8A8 FP8 GEMMs need SM89+ (COST_MODEL.md d.2).
        return self.compute_capability >= 89

    @property
    def native_fp4(self) -> bool:
        # cutlass_scaled_mm_supports_fp4 needs capability >= 100 (d.4); below that vLLM
        # serves NVFP4 checkpoints weight-only through Marlin.
        return self.compute_capability >= 100


class Checkpoint(_Frozen):
    """What `vllm serve` loads for one precision, and how vLLM is told about it."""

    # The positional model argument of `vllm serve` (a hub name or a local path, which may
    # hold spaces: the command is shell-quoted, the manifests' args are lists). A leading "-"
    # would be read as a flag; empty, or whitespace at either end, is no checkpoint.
    repo: str = Field(pattern=r"^[^\s-](.*\S)?$")
    # One word in vLLM's naming (fp8, compressed-tensors, modelopt_fp4): it lands in a shell
    # line and a container's argv, where a value such as "--no-enable-prefix-caching" or
    # "fp8 --trust-remote-code" would be read as more flags, and an empty one fails at start.
    quantization: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="value for --quantization; None lets vLLM auto-detect",
    )


class ModelSpec(_Frozen):
    """Model geometry (parameters, KV layout, MoE routing) plus its checkpoints per tier."""

    name: str
    n_total: float = Field(gt=0, description="total parameters")
    n_active: float = Field(gt=0, description="active parameters per token")
    n_layers: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    n_experts: int = Field(gt=0)
    experts_per_token: int = Field(gt=0)
    n_non_expert: float = Field(ge=0, description="streamed non-expert params (X1: N_sh)")
    n_expert_total: float = Field(ge=0, description="all routed-expert params (X1: N_exp)")
    n_embedding: float = Field(ge=0, description="input embedding (a gather, not streamed)")
    n_lm_head: float = Field(ge=0, description="output projection (kept BF16 under X5)")
    checkpoints: dict[Precision, Checkpoint]
    # vLLM refuses a request with `tools` (tool_choice "auto", the default) with a 400 unless
    # it was started with --enable-auto-tool-choice and the model's --tool-call-parser.
    tool_call_parser: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",  # no leading "-": it would be a flag
        description="value for --tool-call-parser (with --enable-auto-tool-choice); None "
        "leaves tool calling off, and vLLM then refuses requests with tools",
    )

    @model_validator(mode="after")
    def _check_geometry(self) -> ModelSpec:
        # The cost model relies on these: more experts per token than experts makes X1's
        # miss rate negative (a math domain error), and an embedding larger than the active
        # parameters makes X5's streamed bytes, hence every cost, negative.
        if self.experts_per_token > self.n_experts:
            raise ValueError("experts_per_token must not exceed n_experts")
        if self.n_active > self.n_total:
            raise ValueError("n_active must not exceed n_total")
        if self.n_embedding > self.n_active:
            raise ValueError("n_embedding must not exceed n_active (it is part of it)")
        return self


H200: Final = HardwareSpec(
    name="h200", hbm_bytes=141e9, bandwidth=4.8e12, bf16_flops=0.989e15, compute_capability=90
)
B200: Final = HardwareSpec(
    name="b200", hbm_bytes=192e9, bandwidth=8.0e12, bf16_flops=2.25e15, compute_capability=100
)
HARDWARE_PRESETS: Final[dict[str, HardwareSpec]] = {"h200": H200, "b200": B200}


def _qwen3_moe(
    name: str, checkpoints: dict[Precision, Checkpoint], tool_call_parser: str
) -> ModelSpec:
    # Qwen3-30B-A3B geometry: hidden 2048, 48 layers, 4 KV heads of 128, 128 experts top-8,
    # vocab 151936 untied, so embedding and lm_head are 0.311e9 parameters each.
    return ModelSpec(
        name=name,
        n_total=30.5e9,
        n_active=3.3e9,
        n_layers=48,
        n_kv_heads=4,
        head_dim=128,
        n_experts=128,
        experts_per_token=8,
        n_non_expert=1.23e9,
        n_expert_total=28.99e9,
        n_embedding=0.311e9,
        n_lm_head=0.311e9,
        checkpoints=checkpoints,
        tool_call_parser=tool_call_parser,
    )


# Checkpoint names appear in public code (COST_MODEL.md d); they were not checked against the
# Hugging Face Hub. Override them in YAML for a real deployment.
QWEN3_30B_A3B: Final = _qwen3_moe(
    "qwen3-30b-a3b",
    {
        "bf16": Checkpoint(repo="Qwen/Qwen3-30B-A3B"),
        "fp16": Checkpoint(repo="Qwen/Qwen3-30B-A3B"),
        "fp8": Checkpoint(repo="Qwen/Qwen3-30B-A3B-FP8", quantization="fp8"),
        "w4a16": Checkpoint(
            repo="RedHatAI/Qwen3-30B-A3B-quantized.w4a16", quantization="compressed-tensors"
        ),
        "nvfp4": Checkpoint(repo="nvidia/Qwen3-30B-A3B-NVFP4", quantization="modelopt_fp4"),
    },
    tool_call_parser="hermes",  # Qwen3's <tool_call> JSON format
)
# Same architecture as Qwen3-30B-A3B (COST_MODEL.md seeds, Paper A). The NVFP4 build is a
# community quantisation of unknown format, so vLLM is left to auto-detect it.
QWEN3_CODER_30B_A3B: Final = _qwen3_moe(
    "qwen3-coder-30b-a3b",
    {
        "bf16": Checkpoint(repo="Qwen/Qwen3-Coder-30B-A3B-Instruct"),
        "fp16": Checkpoint(repo="Qwen/Qwen3-Coder-30B-A3B-Instruct"),
        "fp8": Checkpoint(repo="Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8", quantization="fp8"),
        "w4a16": Checkpoint(
            repo="QuantTrio/Qwen3-Coder-30B-A3B-Instruct-AWQ", quantization="awq_marlin"
        ),
        "nvfp4": Checkpoint(repo="ig1/Qwen3-Coder-30B-A3B-Instruct-NVFP4"),
    },
    tool_call_parser="qwen3_coder",  # the Coder's XML-style calls
)
MODEL_PRESETS: Final[dict[str, ModelSpec]] = {
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "qwen3-coder-30b-a3b": QWEN3_CODER_30B_A3B,
}


def hardware_preset(name: str) -> HardwareSpec:
    """The named hardware preset (case-insensitive); KeyError lists the known names."""
    try:
        return HARDWARE_PRESETS[name.lower()]
    except KeyError:
        raise KeyError(f"unknown hardware {name!r}; known: {sorted(HARDWARE_PRESETS)}") from None


def model_preset(name: str) -> ModelSpec:
    """The named model preset (case-insensitive); KeyError lists the known names."""
    try:
        return MODEL_PRESETS[name.lower()]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {sorted(MODEL_PRESETS)}") from None
