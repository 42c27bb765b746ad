"""YAML overrides of every parameter group."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.planner.costmodel import CostModel
from gateway.planner.params import Settings, settings_from_yaml


def test_defaults_are_p0() -> None:
    model = CostModel.from_settings(Settings())
    assert model == CostModel.p0()


def test_yaml_overrides_merge() -> None:
    s = settings_from_yaml(
        """
hardware: h200
model: {preset: qwen3-coder-30b-a3b, n_total: 31.0e9}
cost: {l_in: 4096, eta: {nvfp4: 0.6}, extensions: {expert_union: true}}
serve: {prompt_lookup_min: 3, prompt_lookup_max: 5}
policy: {dwell_s: 60}
"""
    )
    assert s.hardware.name == "h200"
    assert s.model.name == "qwen3-coder-30b-a3b" and s.model.n_total == 31.0e9
    assert s.cost.eta["nvfp4"] == 0.6 and s.cost.eta["fp8"] == 0.9  # others kept
    assert s.cost.extensions.expert_union and not s.cost.extensions.kv_read
    assert s.serve.prompt_lookup_max == 5
    assert s.policy.dwell_s == 60 and s.policy.confirmations == 3
    model = CostModel.from_settings(s)
    assert model.rho_star("fp16", 32) == pytest.approx(0.032)


def test_overriding_one_checkpoint_keeps_the_presets_others() -> None:
    """The checkpoint map replaced the preset's: every other tier lost its checkpoint, and
    planning one of them failed with a bare KeyError ("error: 'fp8'")."""
    s = settings_from_yaml(
        "model: {preset: qwen3-coder-30b-a3b, checkpoints: {nvfp4: {repo: me/nvfp4}}}"
    )
    assert s.model.checkpoints["nvfp4"].repo == "me/nvfp4"
    assert s.model.checkpoints["fp8"].repo == "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8"
    assert set(s.model.checkpoints) == {"bf16", "fp16", "fp8", "w4a16", "nvfp4"}


def test_an_fp8_kv_cache_with_its_bytes_doubles_the_knee() -> None:
    s = settings_from_yaml("serve: {kv_cache_dtype: fp8}\ncost: {kv_bytes_per_element: 1}")
    assert CostModel.from_settings(s).knee("fp16") == 650  # floor(131e9 / (4096 * 49,152))


def test_custom_hardware_mapping() -> None:
    s = settings_from_yaml(
        "hardware: {name: x, hbm_bytes: 80e9, bandwidth: 3.35e12, bf16_flops: 0.99e15, "
        "compute_capability: 90}"
    )
    assert CostModel.from_settings(s).knee("fp16") == 47


@pytest.mark.parametrize(
    "text",
    [
        "cost: {bogus: 1}",
        "serve: {prompt_lookup_min: 5, prompt_lookup_max: 2}",
        "cost: {gpu_memory_fraction: 1.5}",
        "- a list",
        # vLLM has no such --kv-cache-dtype: the rendered `vllm serve` line would not start
        "serve: {kv_cache_dtype: bf16}",
        # an FP8 KV cache planned with BF16's bytes: the knee would be half vLLM's
        "serve: {kv_cache_dtype: fp8}",
    ],
)
def test_invalid_yaml(text: str) -> None:
    with pytest.raises((ValidationError, ValueError)):
        settings_from_yaml(text)


def test_unknown_preset() -> None:
    # A ValueError (pydantic's ValidationError), so a gateway config naming it is refused
    # like any other invalid field.
    with pytest.raises(ValueError, match="known"):
        settings_from_yaml("hardware: a100")


@pytest.mark.parametrize(
    "text",
    [
        "cost: {eta: {nvfp4: 0}}",  # r* divides by eta
        "cost: {eta: {nvfp4: -0.5}}",
        "cost: {eta: {nvfp4: 1.2}}",  # an erosion: eta * r must stay an acceptance
        "cost: {eta: {nvfp4: .nan}}",
        "cost: {quality: {fp8: .nan}}",  # Q >= Q_min is then never true nor false
        "cost: {quality: {fp8: 1.5}}",
        "cost: {q_min: -1}",
        "cost: {beta: .inf}",  # no inf or NaN anywhere: the plan is JSON
        "hardware: {preset: b200, bandwidth: .inf}",
    ],
)
def test_eta_quality_and_non_finite_numbers_are_validated(text: str) -> None:
    with pytest.raises(ValidationError):
        settings_from_yaml(text)


@pytest.mark.parametrize(
    ("field", "home"), [("window_s", "observer.window_s"), ("period_s", "observer.plan_interval_s")]
)
def test_the_loops_window_and_period_are_set_where_they_are_read(field: str, home: str) -> None:
    """planner.policy.window_s and period_s were accepted and never read: the gateway plans
    over the observer's window, every observer.plan_interval_s."""
    with pytest.raises(ValidationError, match=f"{field} is not a policy setting: set {home}"):
        Settings.model_validate({"policy": {field: 3600}})
    assert Settings.model_validate({"policy": {"hysteresis": 0.2}}).policy.hysteresis == 0.2


def _bf16_checkpoint(quantization: str) -> str:
    checkpoint = f"{{repo: me/x, quantization: {quantization}}}"
    return f"model: {{preset: qwen3-30b-a3b, checkpoints: {{bf16: {checkpoint}}}}}"


@pytest.mark.parametrize(
    "quantization", ["", "--no-enable-prefix-caching", "fp8 --trust-remote-code", "fp8;rm"]
)
def test_a_checkpoints_quantization_is_one_word(quantization: str) -> None:
    """It follows --quantization in the rendered `vllm serve` line: anything but one plain
    word (vLLM's names) would add flags to that line or leave the option without a value."""
    with pytest.raises(ValidationError, match="quantization"):
        settings_from_yaml(_bf16_checkpoint(f"'{quantization}'"))


@pytest.mark.parametrize("quantization", ["fp8", "compressed-tensors", "modelopt_fp4", "mxfp4"])
def test_vllms_quantization_names_are_accepted(quantization: str) -> None:
    checkpoint = settings_from_yaml(_bf16_checkpoint(quantization)).model.checkpoints["bf16"]
    assert checkpoint.quantization == quantization


@pytest.mark.parametrize("repo", ["", "--trust-remote-code", " me/x", "me/x "])
def test_a_checkpoints_repo_is_one_argument_and_no_flag(repo: str) -> None:
    """`vllm serve REPO`: an empty repo, a flag, or whitespace at either end renders a line
    that serves something else or fails at start."""
    with pytest.raises(ValidationError, match="repo"):
        settings_from_yaml(
            f"model: {{preset: qwen3-30b-a3b, checkpoints: {{bf16: {{repo: '{repo}'}}}}}}"
        )


@pytest.mark.parametrize(
    "repo", ["Qwen/Qwen3-30B-A3B", "/models/qwen3-30b", "./ckpt", "org/x@v1", "/models/Qwen3 30B"]
)
def test_hub_names_and_local_paths_are_checkpoint_repos(repo: str) -> None:
    text = f"model: {{preset: qwen3-30b-a3b, checkpoints: {{bf16: {{repo: '{repo}'}}}}}}"
    assert settings_from_yaml(text).model.checkpoints["bf16"].repo == repo
