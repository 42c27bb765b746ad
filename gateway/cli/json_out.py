"""`--json` output of `plan` and `regime`: one line of strict JSON.

A figure that overflows on absurd inputs (a mean over a span near the float limit, a rho*
past any prefix share) is null: `json.dumps` would write a bare NaN or Infinity, which is not
JSON (jq, JavaScript and orjson refuse it). The router's documents do the same
(`router_models.json_out`). Written by `json`, not orjson: orjson refuses an integer past
64 bits (`regime --capacity-blocks 10**23` echoes one back), which was a traceback.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["one_line"]


def one_line(doc: Any) -> str:
    return json.dumps(_finite_or_null(doc), separators=(",", ":"), ensure_ascii=False)


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(item) for item in value]
    return value
