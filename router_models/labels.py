"""From per-tier scores to what the router learns: adequacy labels and a difficulty target.

Relative label (default): tier k is adequate for a request iff its score is at least the top
tier's. This is what shadow traffic measures later (agreement with the reference precision), and
under it the top tier is adequate by definition. Absolute label: tier k's own score (correctness
in [0, 1]) is its adequacy, so the top tier is calibrated too.

The scorer learns one number per request, its difficulty: the mean over the non-top tiers of
what they lose against the top tier (relative) or of what they get wrong (absolute). For two
tiers and the relative label that is `correct[top] - correct[cheap]` in [-1, 1]: the expected
quality gained by sending the request up, which is the ordering that maximises APGR.
"""

from __future__ import annotations

import warnings
from typing import Final, Literal, get_args

import numpy as np
from numpy.typing import NDArray

__all__ = ["LABELS", "Label", "adequacy", "difficulty", "routing_proba", "routing_proba_one"]

Label = Literal["relative", "absolute"]
LABELS: Final[tuple[Label, ...]] = get_args(Label)


def adequacy(correct: NDArray[np.float64], label: Label = "relative") -> NDArray[np.float64]:
    """(n, K-1) relative or (n, K) absolute adequacy in [0, 1]; NaN where a score is missing."""
    c = _check(correct)
    if label == "absolute":
        return c.copy()
    if label != "relative":
        raise ValueError(f"unknown label {label!r}; expected one of {LABELS}")
    top = c[:, -1:]
    out = (c[:, :-1] >= top).astype(np.float64)
    out[np.isnan(c[:, :-1]) | np.isnan(top)] = np.nan
    return out


def difficulty(correct: NDArray[np.float64], label: Label = "relative") -> NDArray[np.float64]:
    """(n,) difficulty target; NaN for rows with nothing to learn from."""
    c = _check(correct)
    if label == "absolute":
        loss = 1.0 - c[:, :-1]
    elif label == "relative":
        loss = c[:, -1:] - c[:, :-1]
    else:
        raise ValueError(f"unknown label {label!r}; expected one of {LABELS}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows are expected
        return np.asarray(np.nanmean(loss, axis=1), dtype=np.float64)


# Routing probabilities of non-top tiers stay below 1, so a threshold of 1.0 never accepts one.
_BELOW_ONE: Final = float(np.nextafter(1.0, 0.0))


def routing_proba(proba: NDArray[np.float64], label: Label) -> NDArray[np.float64]:
    """(n, K): what routing compares with the thresholds, P(tier k adequate); top tier 1.0.

    Relative probabilities are that already. Absolute ones are P(tier k correct): a request
    that every tier gets wrong has low ones on every tier and would stay on the top tier,
    where it is wrong too (routing on them scored APGR 0.43 on MMLU, below random). Routing
    reads them as one minus tier k's expected accuracy loss against the top tier,
    1 - (p_top - p_k): the relative probability when tier k is never right where the top
    tier is wrong. Calibrated probabilities never fall along the ladder, so this does not.
    """
    p = np.asarray(proba, dtype=np.float64)
    if label == "relative":
        return p
    out = np.ones_like(p)
    out[:, :-1] = np.clip(1.0 - (p[:, -1:] - p[:, :-1]), 0.0, _BELOW_ONE)
    return out


def routing_proba_one(proba: tuple[float, ...], label: Label) -> tuple[float, ...]:
    """`routing_proba` for one request, on plain floats."""
    if label == "relative":
        return proba
    top = proba[-1]
    return (*(min(max(1.0 - (top - p), 0.0), _BELOW_ONE) for p in proba[:-1]), 1.0)


def _check(correct: NDArray[np.float64]) -> NDArray[np.float64]:
    c = np.asarray(correct, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] < 2:
        raise ValueError("correct must have shape (n, K) with K >= 2")
    return c
