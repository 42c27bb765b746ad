"""Strict JSON for the router's documents (model.json, report.json, `--json` output).

Some figures are undefined on some data (a saving where the top tier is no better than the
cheapest is NaN); the JSON standard has no NaN or Infinity, and `json.dumps` would write
them bare, which strict parsers (jq, JavaScript, orjson) reject. They are written as null.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["dumps", "finite_or_none"]


def finite_or_none(value: Any) -> Any:
    """`value` with every non-finite float inside it (dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):  # numpy's float64 is a float too
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """`json.dumps` that writes undefined numbers as null and never emits NaN or Infinity."""
    return json.dumps(finite_or_none(value), allow_nan=False, **options)
