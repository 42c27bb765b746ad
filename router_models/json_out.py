"""Strict JSON for the router's documents (model.json, report.json, `--json` output).

Some figures are undefined on some data (a saving where the top tier is no better than the
cheapest is NaN); the JSON standard has no NaN or Infinity, and `json.dumps` would write
them bare, which strict parsers (jq, JavaScript, orjson) reject. orjson writes them as null.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["dumps"]


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """Indented JSON; undefined numbers (NaN, infinities) become null; numpy values allowed."""
    option = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    if sort_keys:
        option |= orjson.OPT_SORT_KEYS
    return orjson.dumps(value, option=option).decode()
