"""`--json` output of `plan` and `regime`: one line of strict JSON.

A figure that overflows on absurd inputs (a mean over a span near the float limit, a rho*
past any prefix share) is null: `json.dumps` would write a bare NaN or Infinity, which is not
JSON (jq, JavaScript and orjson refuse it). The router's documents do the same
(`router_models.json_out`).
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["one_line"]


def one_line(doc: Any) -> str:
    return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS).decode()
