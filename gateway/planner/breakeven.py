"""The paper's breakeven table (`tiergate plan breakeven --json`), COST_MODEL.md a.3/a.4."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

from gateway.planner.costmodel import CostModel
from gateway.precision import Precision

__all__ = ["BREAKEVEN_PRECISIONS", "breakeven_table"]

BREAKEVEN_PRECISIONS: Final[tuple[Precision, ...]] = ("fp16", "fp8", "w4a16", "nvfp4")


def _num(x: float, digits: int) -> float | None:
    # JSON has no infinity: speculation that can never pay prints as null.
    return None if math.isinf(x) else round(x, digits)


def breakeven_table(
    model: CostModel,
    concurrencies: Sequence[int] = (32, 256),
    precisions: Sequence[Precision] = BREAKEVEN_PRECISIONS,
    *,
    digits: int = 4,
    low: Precision = "nvfp4",
    high: Precision = "fp16",
) -> dict[str, Any]:
    """rho* by B_eff, r* by precision and C, the low/high decode-cost ratio below both knees
    and on the plateau above both, and the knees. Inner keys are the numbers as strings."""
    knees = {p: model.knee(p) for p in precisions}
    plateau_c = max(model.knee(low), model.knee(high))
    return {
        # rho* depends on p only through B_eff (unless the prefill speed-up is on), so it is
        # tabulated against B_eff at the reference precision.
        "rho_star": {str(b): _num(model.rho_star_at_batch(b, high), digits) for b in concurrencies},
        "r_star": {
            p: {str(c): _num(model.r_star(p, c), digits) for c in concurrencies} for p in precisions
        },
        "precision_ratio": {
            "below_knees": _num(model.precision_ratio(1, low, high), digits),
            "plateau": _num(model.precision_ratio(plateau_c, low, high), digits),
        },
        "knees": knees,
    }
