"""Strict JSON for the project's documents: the router's (model.json, report.json, `router
--json`) and the one-line `--json` output of `plan` and `regime`.

Some figures are undefined on some data (a saving where the top tier is no better than the
cheapest is NaN, a figure that overflows on absurd inputs); the JSON standard has no NaN or
Infinity, and `json.dumps` would write them bare, which strict parsers (jq, JavaScript,
orjson) reject. Both writers make them null.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

__all__ = ["dumps", "one_line"]


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """Indented JSON; undefined numbers (NaN, infinities) become null; numpy values allowed."""
    option = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    if sort_keys:
        option |= orjson.OPT_SORT_KEYS
    return orjson.dumps(value, option=option).decode()


def one_line(doc: Any) -> str:
    """Compact one-line JSON; undefined numbers become null. Written by `json`, not orjson:
    orjson refuses an integer past 64 bits (`regime --capacity-blocks 10**23` echoes one
    back), which was a traceback."""
    return json.dumps(_finite_or_null(doc), separators=(",", ":"), ensure_ascii=False)


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(item) for item in value]
    return value
