"""The routing decision: a pure function of calibrated probabilities and a tenant's thresholds.

Walk the ladder from the cheapest tier and take the first tier whose probability of being
adequate clears its threshold; the top tier takes whatever no cheaper tier accepted. Because
calibrated probabilities lie in [0, 1] and non-top tiers are capped below 1, a threshold of 0
sends every request to the cheapest tier and a threshold of 1.0 never accepts a non-top tier.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["decide", "uniform_thresholds"]


def decide(probabilities: Sequence[float], thresholds: Sequence[float]) -> int:
    """Index of the cheapest tier k < K-1 with `probabilities[k] >= thresholds[k]`, else K-1.

    `thresholds` has K-1 entries (one per non-top tier); a K-th entry, if given, is ignored.
    A NaN probability or threshold never accepts its tier.
    """
    top = len(probabilities) - 1
    if top < 0:
        raise ValueError("need at least one tier")
    if len(thresholds) < top:
        raise ValueError(f"need {top} thresholds for {top + 1} tiers, got {len(thresholds)}")
    for k in range(top):
        if probabilities[k] >= thresholds[k]:
            return k
    return top


def uniform_thresholds(tier: int, n_tiers: int) -> tuple[float, ...]:
    """Thresholds that send every request to `tier`: 1.0 below it (calibrated non-top
    probabilities stay under 1), 0.0 at it (every probability clears it)."""
    if not 0 <= tier < n_tiers:
        raise ValueError(f"tier {tier} is not on a ladder of {n_tiers}")
    return tuple(1.0 if k < tier else 0.0 for k in range(n_tiers - 1))
