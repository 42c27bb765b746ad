"""Difficulty router: request features, scorers, isotonic calibration, thresholds, evaluation.

Pure computation and scikit-learn estimators only; no network or server code lives here.
"""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES

# The modules one routing decision runs through; setup.py compiles exactly these with mypyc
# when built with TIERGATE_COMPILE=1.
HOT_PATH_MODULES = ("request", "ngrams", "features", "lean", "isotonic_maps")


def router_build() -> str:
    """Which build of the hot-path modules is running: `mypyc` (compiled), `python` (the
    source) or `mixed` (only some compiled: a broken install)."""
    compiled = [
        str(importlib.import_module(f"{__name__}.{name}").__file__).endswith(
            tuple(EXTENSION_SUFFIXES)
        )
        for name in HOT_PATH_MODULES
    ]
    if all(compiled):
        return "mypyc"
    return "mixed" if any(compiled) else "python"
