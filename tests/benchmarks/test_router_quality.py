"""The Llama section's intervals in benchmarks/router_quality.py: seeds repeat the prompts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from sklearn.model_selection import KFold

from benchmarks.router_quality import _alpha_summary, _baseline
from router_models.data import LabelSet

N_PROMPTS, SEEDS, BOOT = 200, 4, 500


def held_out_runs(n: int, seeds: int) -> list[dict[str, Any]]:
    """Runs as `_held_out_runs` makes them: every seed tests each prompt once, in its own
    fold order; tuned routing always picks the top tier, uniform the cheapest."""
    runs = []
    for seed in range(seeds):
        for _, test in KFold(5, shuffle=True, random_state=100 + seed).split(np.arange(n)):
            chosen = np.full(len(test), 2)
            runs.append(
                {
                    "seed": seed,
                    "test": test,
                    "decisions": {0.97: {"chosen": chosen, "uniform": 0, "claimed": True}},
                }
            )
    return runs


def test_paired_interval_resamples_prompts_not_seed_copies() -> None:
    rng = np.random.default_rng(3)
    correct = (rng.random((N_PROMPTS, 3)) < 0.6).astype(float)
    labels = SimpleNamespace(correct=correct)
    summary = _alpha_summary(labels, held_out_runs(N_PROMPTS, SEEDS), 0.97, (0.25, 0.5, 1.0), BOOT)  # type: ignore[arg-type]
    # Each prompt's difference is the same in every seed: the interval is the bootstrap of
    # the prompts' own differences (same generator seed as the benchmark).
    per_prompt = correct[:, 2] - correct[:, 0]
    idx = np.random.default_rng(0).integers(0, N_PROMPTS, size=(BOOT, N_PROMPTS))
    means = per_prompt[idx].mean(axis=1)
    expected = [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]
    assert np.allclose(summary["quality_difference_ci95"], expected)


def test_wilson_interval_counts_prompts_once() -> None:
    rng = np.random.default_rng(4)
    correct = (rng.random((N_PROMPTS, 3)) < 0.6).astype(float)
    labels = SimpleNamespace(correct=correct)
    summary = _alpha_summary(
        labels,  # type: ignore[arg-type]
        held_out_runs(N_PROMPTS, SEEDS),
        0.97,
        (0.25, 0.5, 1.0),
        BOOT,
    )
    # Uniform routing answers each prompt the same way in every seed: N_PROMPTS answers.
    p, n, z = correct[:, 0].mean(), N_PROMPTS, 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert np.allclose(summary["uniform"]["quality_wilson95"], [centre - half, centre + half])


def test_baseline_folds_keep_a_duplicated_prompt_on_one_side() -> None:
    # Every prompt twice, each a unique word with a random "strong wins" label: the text
    # says nothing about a new prompt, so only a copy seen in training can predict it.
    rng = np.random.default_rng(5)
    n = 150
    wins = rng.random(n) < 0.5
    requests = tuple(
        {"messages": [{"role": "user", "content": f"prompt{i % n}"}]} for i in range(2 * n)
    )
    strong = np.concatenate([wins, wins]).astype(float)
    correct = np.column_stack([np.zeros(2 * n), strong])
    ids = tuple(str(i) for i in range(2 * n))
    labels = LabelSet(("cheap", "strong"), requests, correct, ids)
    apgr = _baseline(labels, (0.5, 1.0), 5)["apgr"]
    assert apgr < 0.6  # folds over rows, a copy in training: 0.74 here (random: 0.5)
