"""Numeric precisions a tier can serve at, and the facts every layer reads from them."""

from __future__ import annotations

from typing import Final, Literal, get_args

Precision = Literal["bf16", "fp16", "fp8", "w4a16", "nvfp4"]
PRECISIONS: Final[tuple[Precision, ...]] = get_args(Precision)

# Nominal weight bytes per parameter (COST_MODEL.md a.1, b(p)).
BYTES_PER_PARAM: Final[dict[Precision, float]] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "w4a16": 0.5,
    "nvfp4": 0.5,
}


def relative_cost(precision: Precision) -> float:
    """Decode cost relative to a 16-bit tier: bytes per parameter over two."""
    return BYTES_PER_PARAM[precision] / 2.0


__all__ = ["BYTES_PER_PARAM", "PRECISIONS", "Precision", "relative_cost"]
