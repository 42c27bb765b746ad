"""The paper's breakeven table (`tiergate plan breakeven --json`), COST_MODEL.md a.3/a.4."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

from gateway.planner.costmodel import CostModel
from gateway.precision import Precision

__all__ = ["BREAKEVEN_PRECISIONS", "breakeven_table"]

BREAKEVEN_PRECISIONS: Final[tuple[Precision, ...]] = ("fp16", "fp8", "w4a16", "nvfp4")


def _num(x: float | None, digits: int) -> float | None:
    # JSON has no infinity: speculation that can never pay prints as null, and so does a
    # precision whose weights do not fit (it has no batch to break even at).
    return None if x is None or math.isinf(x) else round(x, digits)


def _rho_star(model: CostModel, p: Precision, c: float) -> float | None:
    return model.rho_star(p, c) if model.fits(p) else None


def _r_star(model: CostModel, p: Precision, c: float) -> float | None:
    return model.r_star(p, c) if model.fits(p) else None


def _ratio(model: CostModel, c: float, low: Precision, high: Precision) -> float | None:
    if not (model.fits(low) and model.fits(high)):
        return None
    return model.precision_ratio(c, low, high)


def breakeven_table(
    model: CostModel,
    concurrencies: Sequence[int] = (32, 256),
    precisions: Sequence[Precision] = BREAKEVEN_PRECISIONS,
    *,
    digits: int = 4,
    low: Precision = "nvfp4",
    high: Precision = "fp16",
) -> dict[str, Any]:
    """rho* and r* per precision by C, the low/high decode-cost ratio below both knees and on
    the plateau above both, and the knees. Inner keys are the numbers as strings. Every
    breakeven is at B_eff = min(C, K(p)) (a.2 items 11, 12); a precision that does not fit
    gives null."""
    knees = {p: model.knee(p) for p in precisions}
    plateau_c = max(model.knee(low), model.knee(high))
    return {
        # rho* depends on p through B_eff (the knees differ) and, with the prefill speed-up
        # on, through phi(p): above FP16's knee NVFP4 needs more prefix sharing to pay.
        "rho_star": {
            p: {str(c): _num(_rho_star(model, p, c), digits) for c in concurrencies}
            for p in precisions
        },
        "r_star": {
            p: {str(c): _num(_r_star(model, p, c), digits) for c in concurrencies}
            for p in precisions
        },
        "precision_ratio": {
            "below_knees": _num(_ratio(model, 1, low, high), digits),
            "plateau": _num(_ratio(model, plateau_c, low, high), digits),
        },
        "knees": knees,
    }
