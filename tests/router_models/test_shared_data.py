"""The real label sets (../shared/data): they load, and the shipped model matches them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from router_models.costs import default_costs
from router_models.data import load_labels
from router_models.model import RouterModel, default_model_path
from router_models.model_io import load_validation
from router_models.pretest import pretest
from router_models.thresholds import tune

LLAMA = "labels/mmlu_llama31_8b_precision.jsonl"
MIXTRAL = "labels/mmlu_mixtral_vs_gpt4.jsonl.gz"


def test_both_label_sets_load(shared_data: Path) -> None:
    llama = load_labels([shared_data / LLAMA], ("q4_k_m", "q8_0", "fp16"))
    mixtral = load_labels([shared_data / MIXTRAL])
    assert (len(llama), len(mixtral)) == (499, 14042)
    assert mixtral.tiers == ("mixtral_8x7b", "gpt4_1106")
    np.testing.assert_allclose(llama.correct.mean(axis=0), [0.5691, 0.5872, 0.5852], atol=1e-4)


def test_shipped_validation_set_is_the_llama_set(shared_data: Path) -> None:
    llama = load_labels([shared_data / LLAMA], ("q4_k_m", "q8_0", "fp16"))
    validation = load_validation(default_model_path())
    assert validation is not None
    proba, correct = validation
    np.testing.assert_array_equal(correct, llama.correct)
    assert proba.shape == (499, 3) and np.all(proba[:, -1] == 1.0)


def test_routing_does_not_pay_on_the_llama_precision_set(shared_data: Path) -> None:
    """The honest verdict on this set: no pre-test saving, and tune keeps the cheapest uniform
    tier at a 95% floor (q4_k_m already meets it)."""
    llama = load_labels([shared_data / LLAMA], ("q4_k_m", "q8_0", "fp16"))
    proba, correct = load_validation(default_model_path()) or (None, None)
    assert proba is not None and correct is not None
    costs, _ = default_costs(llama.tiers)
    assert not pretest(proba, correct, costs).routing_pays
    result = tune(proba, correct, costs, alpha=0.95)
    assert not result.routing_pays and result.baseline.tier == 0
    assert result.thresholds == (0.0, 0.0)


def test_default_model_scores_the_llama_prompts(shared_data: Path) -> None:
    llama = load_labels([shared_data / LLAMA], ("q4_k_m", "q8_0", "fp16"))
    model = RouterModel.load(default_model_path())
    batch = model.predict_proba(llama.requests[:50])
    lean = np.array([model.predict_proba_one(r) for r in llama.requests[:50]])
    np.testing.assert_allclose(lean, batch, atol=1e-12)
    # Close to the base rate of q4_k_m adequacy (94.6%), as the card says.
    assert abs(model.predict_proba(llama.requests)[:, 0].mean() - 0.946) < 0.02
