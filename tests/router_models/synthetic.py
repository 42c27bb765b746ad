"""Synthetic label sets with a known answer: two request types whose words reveal the type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router_models.data import LabelSet

EASY_WORDS = ("format", "rename", "lookup", "boilerplate", "indent", "sort")
HARD_WORDS = ("refactor", "prove", "concurrency", "invariant", "optimise", "derive")


def two_type_labels(
    n: int,
    p_easy: float,
    eps: float,
    delta: float,
    *,
    q_top: float = 0.9,
    tiers: tuple[str, ...] = ("nvfp4", "bf16"),
    seed: int = 0,
) -> tuple[LabelSet, NDArray[np.bool_]]:
    """n requests; easy with probability p_easy. The top tier is right with probability q_top;
    the cheapest tier additionally fails with probability eps (easy) or delta (hard) on requests
    the top tier gets right. Middle tiers (if any) fail half as often as the cheapest.
    """
    rng = np.random.default_rng(seed)
    easy = rng.random(n) < p_easy
    top = (rng.random(n) < q_top).astype(np.float64)
    loss = np.where(easy, eps, delta)
    cheap = np.where(rng.random(n) < loss, 0.0, top)
    middle = [np.where(rng.random(n) < loss / 2.0, 0.0, top) for _ in range(len(tiers) - 2)]
    correct = np.column_stack([cheap, *middle, top])
    requests = tuple(_request(rng, bool(e)) for e in easy)
    ids = tuple(f"syn-{i}" for i in range(n))
    return (
        LabelSet(tiers, requests, correct, ids, {"synthetic": n}, {"synthetic": n}),
        easy,
    )


def _request(rng: np.random.Generator, easy: bool) -> dict[str, Any]:
    words = EASY_WORDS if easy else HARD_WORDS
    picked = rng.choice(words, size=3)
    filler = rng.choice(("the", "code", "please", "file", "this", "function"), size=4)
    text = " ".join([*picked, *filler])
    if not easy:
        text += "\n```python\nx = 1\n```"
    return {"messages": [{"role": "user", "content": text}]}


def write_jsonl(path: Path, labels: LabelSet) -> Path:
    with path.open("w") as handle:
        for request, row, rid in zip(labels.requests, labels.correct, labels.ids, strict=True):
            doc = {
                "id": rid,
                **request,
                "correct": {t: float(v) for t, v in zip(labels.tiers, row, strict=True)},
                "source": "synthetic (tests)",
            }
            handle.write(json.dumps(doc) + "\n")
    return path
