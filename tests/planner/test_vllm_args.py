"""`vllm serve` flags per precision and toggle (COST_MODEL.md d)."""

from __future__ import annotations

import json
import shlex

import pytest

from gateway.planner.params import CostParams, ServeParams
from gateway.planner.presets import ModelSpec, hardware_preset, model_preset
from gateway.planner.vllm_args import (
    precision_notes,
    serve_command,
    speculative_config,
    vllm_serve_args,
)
from gateway.precision import Precision

MODEL = model_preset("qwen3-30b-a3b")


def _args(p: Precision, *, s: bool = False, k: bool = False, model: ModelSpec = MODEL) -> list[str]:
    return vllm_serve_args(
        p, speculative=s, prefix_caching=k, model=model, cost=CostParams(), serve=ServeParams()
    )


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize(
    ("p", "repo", "quant", "dtype", "kv"),
    [
        ("bf16", "Qwen/Qwen3-30B-A3B", None, "bfloat16", "bfloat16"),
        ("fp16", "Qwen/Qwen3-30B-A3B", None, "float16", "float16"),
        ("fp8", "Qwen/Qwen3-30B-A3B-FP8", "fp8", "bfloat16", "bfloat16"),
        (
            "w4a16",
            "RedHatAI/Qwen3-30B-A3B-quantized.w4a16",
            "compressed-tensors",
            "bfloat16",
            "bfloat16",
        ),
        ("nvfp4", "nvidia/Qwen3-30B-A3B-NVFP4", "modelopt_fp4", "bfloat16", "bfloat16"),
    ],
)
def test_precision_flags(p: Precision, repo: str, quant: str | None, dtype: str, kv: str) -> None:
    args = _args(p)
    assert args[0] == repo
    assert _flag(args, "--dtype") == dtype
    assert _flag(args, "--kv-cache-dtype") == kv  # pinned (X6), 16-bit like the activations
    if quant is None:
        assert "--quantization" not in args
    else:
        assert _flag(args, "--quantization") == quant
    assert _flag(args, "--max-model-len") == "4096"
    assert _flag(args, "--max-num-seqs") == "1024"
    assert _flag(args, "--gpu-memory-utilization") == "0.92"


def test_toggles() -> None:
    off = _args("nvfp4")
    assert "--no-enable-prefix-caching" in off and "--speculative-config" not in off
    on = _args("nvfp4", s=True, k=True)
    assert "--enable-prefix-caching" in on
    config = json.loads(_flag(on, "--speculative-config"))
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }


def test_per_batch_speculation() -> None:
    ranges = [(1, 64, True), (65, 1024, False)]
    config = json.loads(speculative_config(CostParams(), ServeParams(), ranges))
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 64, 4], [65, 1024, 0]]
    everywhere = json.loads(speculative_config(CostParams(), ServeParams(), [(1, 1024, True)]))
    assert "num_speculative_tokens_per_batch_size" not in everywhere


def test_serve_command_quotes_json() -> None:
    line = serve_command(_args("fp8", s=True))
    assert line.startswith("vllm serve Qwen/Qwen3-30B-A3B-FP8 ")
    assert shlex.split(line)[2:] == _args("fp8", s=True)


def test_nvfp4_native_on_b200_weight_only_on_h200() -> None:
    assert "native W4A4" in precision_notes("nvfp4", hardware_preset("b200"))[0]
    assert "Marlin" in precision_notes("nvfp4", hardware_preset("h200"))[0]


def test_coder_checkpoints() -> None:
    coder = model_preset("qwen3-coder-30b-a3b")
    args = vllm_serve_args(
        "fp8",
        speculative=False,
        prefix_caching=True,
        model=coder,
        cost=CostParams(),
        serve=ServeParams(),
    )
    assert args[0] == "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8"


def test_an_empty_batch_range_writes_no_table() -> None:
    """Speculation paying up to the largest batch the engine runs needs no per-batch table:
    a range that starts past max_num_seqs is empty and is dropped."""
    cost = CostParams()
    top = cost.max_num_seqs
    config = json.loads(
        speculative_config(cost, ServeParams(), [(1, top, True), (top + 1, top, False)])
    )
    assert "num_speculative_tokens_per_batch_size" not in config
    below = json.loads(
        speculative_config(cost, ServeParams(), [(1, top - 1, True), (top, top, False)])
    )
    assert below["num_speculative_tokens_per_batch_size"][1] == [top, top, 0]


@pytest.mark.parametrize(
    ("preset", "parser"), [("qwen3-30b-a3b", "hermes"), ("qwen3-coder-30b-a3b", "qwen3_coder")]
)
def test_tool_calling_is_turned_on_with_the_models_parser(preset: str, parser: str) -> None:
    """Without both flags vLLM answers every request with `tools` (tool_choice "auto", the
    default) with a 400, so a tier started from the plan could not serve a tool call."""
    model = model_preset(preset)
    for p in model.checkpoints:
        args = _args(p, k=True, model=model)
        assert "--enable-auto-tool-choice" in args and _flag(args, "--tool-call-parser") == parser
    args = _args("bf16", k=True, model=model.model_copy(update={"tool_call_parser": None}))
    assert "--enable-auto-tool-choice" not in args and "--tool-call-parser" not in args


def test_a_tool_call_parser_is_one_word() -> None:
    """It lands in a shell line and a container's argv: no spaces or quotes."""
    data = model_preset("qwen3-30b-a3b").model_dump()
    with pytest.raises(ValueError, match="tool_call_parser"):
        type(MODEL).model_validate({**data, "tool_call_parser": "hermes --api-key x"})
    with pytest.raises(ValueError, match="tool_call_parser"):  # a flag, not a parser
        type(MODEL).model_validate({**data, "tool_call_parser": "--trust-remote-code"})
    assert type(MODEL).model_validate({**data, "tool_call_parser": "llama3_json"})
