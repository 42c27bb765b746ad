"""Relative tier costs: from precision names (weight bytes per parameter) or given explicitly.

A tier's default cost is its weight bytes per parameter over two, i.e. relative to a 16-bit
tier (decode is memory-bound, so bytes read per token set its cost; Paper A, COST_MODEL.md):

| name pattern (case-insensitive)                        | bits | cost  |
|--------------------------------------------------------|------|-------|
| bf16, fp16, f16, float16, half                         | 16   | 1.0   |
| fp32, f32, float32                                     | 32   | 2.0   |
| fp8, f8, int8, w8a8, w8a16, q8_0, q8_*                 | 8    | 0.5   |
| q6_k                                                   | 6    | 0.375 |
| q5_k_m, q5_0, ...                                      | 5    | 0.3125|
| w4a16, int4, q4_k_m, q4_0, nvfp4, mxfp4, fp4, awq, gptq| 4    | 0.25  |
| q3_k_m, q2_k, ...                                      | 3, 2 | bits/16 |

GGUF k-quants use nominal bits (q4_k_m really stores about 4.8 bits per weight); pass
`--costs` when the difference matters. Costs must not fall along the ladder; equal neighbours
are allowed (nvfp4 and w4a16 read the same weight bytes; nvfp4 saves compute, not bandwidth).
Names that match none of these (e.g. model names in a cross-model data set) get the documented
ladder default `(k + 1) / K` for position k, and the caller is told so through
`CostSource.LADDER_DEFAULT`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from enum import StrEnum
from itertools import pairwise
from typing import Final

from gateway.precision import PRECISIONS, relative_cost
from router_models.errors import TierError

__all__ = ["CostSource", "default_costs", "parse_costs", "precision_cost", "resolve_costs"]

_BITS_PATTERNS: Final = (
    re.compile(r"^(?:bf|fp|f|float)(\d+)$"),
    re.compile(r"^w(\d+)a\d+$"),
    re.compile(r"^(?:int|i)(\d+)$"),
    re.compile(r"^q(\d+)(?:_[a-z0-9]+)*$"),
    re.compile(r"^(?:nv|mx)fp(\d+)$"),
    re.compile(r"^iq(\d+)(?:_[a-z0-9]+)*$"),
)
_ALIASES: Final[dict[str, float]] = {"half": 1.0, "awq": 0.25, "gptq": 0.25}


class CostSource(StrEnum):
    """Where a ladder's costs came from."""

    PRECISION = "precision-bytes"
    EXPLICIT = "explicit"
    LADDER_DEFAULT = "ladder-default"


def precision_cost(name: str) -> float | None:
    """Cost of a tier named after a precision, relative to 16-bit; None if the name is not one."""
    key = name.strip().lower()
    if key in PRECISIONS:
        return relative_cost(key)
    if key in _ALIASES:
        return _ALIASES[key]
    for pattern in _BITS_PATTERNS:
        match = pattern.match(key)
        if match:
            bits = int(match.group(1))
            return bits / 16.0 if 1 <= bits <= 32 else None
    return None


def default_costs(tiers: Sequence[str]) -> tuple[tuple[float, ...], CostSource]:
    """Precision costs when every name is a precision, else the ladder default (k + 1) / K."""
    found = [precision_cost(t) for t in tiers]
    if all(c is not None for c in found):
        costs = tuple(float(c) for c in found if c is not None)
        _check_ladder(tiers, costs)
        return costs, CostSource.PRECISION
    k = len(tiers)
    return tuple((i + 1) / k for i in range(k)), CostSource.LADDER_DEFAULT


def parse_costs(text: str, tiers: Sequence[str]) -> tuple[float, ...]:
    """`"a=0.25,b=0.5,c=1"` -> costs in ladder order; every tier once, increasing."""
    given: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise TierError(f"--costs wants name=value pairs, got {item.strip()!r}")
        try:
            cost = float(value)
        except ValueError:
            raise TierError(f"cost of {name!r} is not a number: {value.strip()!r}") from None
        if not 0.0 < cost < math.inf:
            raise TierError(f"cost of {name!r} must be a positive number, got {value.strip()!r}")
        if name in given:
            raise TierError(f"--costs names {name!r} twice")
        given[name] = cost
    unknown = sorted(set(given) - set(tiers))
    missing = [t for t in tiers if t not in given]
    if unknown or missing:
        raise TierError(
            "--costs must name exactly the ladder's tiers "
            f"({', '.join(tiers)}); unknown: {', '.join(unknown) or '-'}, "
            f"missing: {', '.join(missing) or '-'}"
        )
    costs = tuple(given[t] for t in tiers)
    _check_ladder(tiers, costs)
    return costs


def resolve_costs(
    tiers: Sequence[str], text: str | None = None
) -> tuple[tuple[float, ...], CostSource]:
    """Explicit costs when given, else `default_costs`."""
    if text:
        return parse_costs(text, tiers), CostSource.EXPLICIT
    return default_costs(tiers)


def _check_ladder(tiers: Sequence[str], costs: Sequence[float]) -> None:
    """Cheapest first: costs never fall, and the top tier costs more than the cheapest.

    Equal neighbours are allowed (nvfp4 and w4a16 both read 4-bit weights).
    """
    for (a, ca), (b, cb) in pairwise(zip(tiers, costs, strict=True)):
        if ca > cb:
            raise TierError(
                f"tiers must be listed cheapest first: {a}={ca:g} costs more than {b}={cb:g}"
            )
    if not costs[0] < costs[-1]:
        raise TierError(
            f"the top tier {tiers[-1]} must cost more than the cheapest {tiers[0]}; "
            "pass --costs to set them"
        )
