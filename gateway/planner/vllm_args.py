"""Real `vllm serve` arguments for one tier (COST_MODEL.md d, vLLM 0.33).

Every toggle the planner decides is a startup flag, so a change is a restart: the checkpoint
(and `--quantization`) picks the precision, `--[no-]enable-prefix-caching` the cache, and
`--speculative-config` the n-gram proposer. The KV dtype is pinned on every tier (X6) so that a
ModelOpt checkpoint cannot silently switch it to FP8 and double that tier's knee.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Final

from gateway.planner.params import CostParams, ServeParams
from gateway.planner.presets import HardwareSpec, ModelSpec
from gateway.precision import Precision

__all__ = ["precision_notes", "serve_command", "speculative_config", "vllm_serve_args"]

# --dtype sets the activation (and unquantized-weight) dtype; Qwen3 checkpoints are BF16.
_DTYPE: Final[dict[Precision, str]] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "bfloat16",
    "w4a16": "bfloat16",
    "nvfp4": "bfloat16",
}


def _kv_cache_dtype(p: Precision, serve: ServeParams) -> str:
    # A 16-bit KV cache must match the 16-bit activation dtype for the attention kernels; FP16
    # and BF16 have the same bytes, so kappa (and the knee) is unchanged.
    if p == "fp16" and serve.kv_cache_dtype == "bfloat16":
        return "float16"
    return serve.kv_cache_dtype


def speculative_config(
    cost: CostParams,
    serve: ServeParams,
    batch_ranges: Sequence[tuple[int, int, bool]] | None = None,
) -> str:
    """The JSON value of `--speculative-config` for vLLM's n-gram proposer.

    Lookup bounds are always explicit: when neither is given vLLM uses min = max = 5. With
    `batch_ranges`, inclusive (first, last, speculate) runs from batch 1 to max_num_seqs,
    `num_speculative_tokens_per_batch_size` switches k to 0 at the batch sizes where it does
    not pay (d.5), which encodes r*(p, B) in the engine itself.
    """
    k = cost.num_speculative_tokens
    config: dict[str, object] = {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_min": serve.prompt_lookup_min,
        "prompt_lookup_max": serve.prompt_lookup_max,
    }
    if batch_ranges is not None:
        runs = [[first, last, k if on else 0] for first, last, on in batch_ranges if first <= last]
        if any(run[2] == 0 for run in runs):  # k everywhere needs no per-batch table
            config["num_speculative_tokens_per_batch_size"] = runs
    return json.dumps(config)


def vllm_serve_args(
    p: Precision,
    *,
    speculative: bool,
    prefix_caching: bool,
    model: ModelSpec,
    cost: CostParams,
    serve: ServeParams,
    spec_batch_ranges: Sequence[tuple[int, int, bool]] | None = None,
) -> list[str]:
    """The argv after `vllm serve`: the checkpoint, then flags. JSON values are single items."""
    checkpoint = model.checkpoints[p]
    args = [checkpoint.repo, "--dtype", _DTYPE[p]]
    if checkpoint.quantization is not None:
        args += ["--quantization", checkpoint.quantization]
    args += [
        "--kv-cache-dtype",
        _kv_cache_dtype(p, serve),
        "--max-model-len",
        str(cost.l_ctx),
        "--max-num-seqs",
        str(cost.max_num_seqs),
        "--gpu-memory-utilization",
        f"{serve.gpu_memory_utilization:g}",
        "--block-size",
        str(serve.block_size),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
    ]
    if model.tool_call_parser is not None:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", model.tool_call_parser]
    if speculative:
        args += [
            "--speculative-config",
            speculative_config(cost, serve, spec_batch_ranges),
        ]
    return args


def serve_command(args: list[str]) -> str:
    """A shell-quoted `vllm serve ...` line."""
    return shlex.join(["vllm", "serve", *args])


def precision_notes(p: Precision, hardware: HardwareSpec) -> list[str]:
    """What the precision means on this GPU (d.2-d.4), for the plan's reasons."""
    if p == "nvfp4":
        if hardware.native_fp4:
            return [
                f"nvfp4 on {hardware.name}: native W4A4 FP4 GEMMs (SM{hardware.compute_capability})"
            ]
        return [
            f"nvfp4 on {hardware.name}: weight-only FP4 through Marlin "
            f"(SM{hardware.compute_capability} has no FP4 tensor cores); saves memory and "
            "bandwidth like w4a16, BF16 compute"
        ]
    if p == "fp8":
        if hardware.native_fp8:
            return [f"fp8 on {hardware.name}: native W8A8 FP8 GEMMs"]
        return [f"fp8 on {hardware.name}: weight-only FP8 (no native FP8 compute)"]
    if p == "w4a16":
        return ["w4a16: 4-bit weights, 16-bit activations (Marlin WNA16 kernels, MoE included)"]
    return []
