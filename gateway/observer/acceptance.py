"""The i.i.d. acceptance model A(a, k) = (1 - a^(k+1)) / (1 - a) and its inverse.

It turns a measured tokens-per-round (replayed A_sim or the engine's A_obs) into the
i.i.d.-equivalent acceptance r (COST_MODEL.md a.1, X7), and it is the speculation term of the
cost model, which re-exports it. It lives here, below the planner, so the observer can use it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["accepted_per_round", "inverse_accepted_per_round"]

_BISECTION_STEPS: Final = 200


def accepted_per_round(a: float, k_s: int) -> float:
    """A(a, k_s): expected tokens per round with k_s drafts each accepted with probability a."""
    if a <= 0.0:
        return 1.0
    if a >= 1.0:
        return float(k_s + 1)
    return (1.0 - a ** (k_s + 1)) / (1.0 - a)


def inverse_accepted_per_round(tokens_per_round: float, k_s: int) -> float:
    """A^-1 by bisection on [0, 1]: 0 at or below one token per round, 1 at or above k_s + 1."""
    if tokens_per_round <= 1.0:
        return 0.0
    if tokens_per_round >= k_s + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if accepted_per_round(mid, k_s) < tokens_per_round:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return 0.5 * (lo + hi)
