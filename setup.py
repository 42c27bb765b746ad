"""Optional compiled build of the router's per-request path (everything else is in pyproject).

`TIERGATE_COMPILE=1 pip install --no-build-isolation .` (or `pip wheel`) compiles the modules
one routing decision runs through with mypyc, which ships with mypy: the same source,
1.3-1.6x faster (benchmarks/router_hotpath.py measures both builds). Without the variable the
package is pure Python, which is what editable installs, `make run` and `make test` use, so a
compiled module can never shadow an edited source file. The tests build this variant once and
check that it gives the same features and probabilities as the source
(tests/router_models/test_compiled.py).
"""

from __future__ import annotations

import os

from setuptools import setup

# The one-request path: request view, tokens, dense features, lean scorer, calibration maps
# (router_models.HOT_PATH_MODULES; router_models.router_build() reports which build runs).
COMPILED_MODULES = [
    f"router_models/{name}.py"
    for name in ("request", "ngrams", "features", "lean", "isotonic_maps")
]

ext_modules = []
if os.environ.get("TIERGATE_COMPILE") == "1":
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        raise SystemExit(
            "TIERGATE_COMPILE=1 needs mypy (which ships mypyc) and a C compiler in the build "
            "environment: pip install mypy, then build with --no-build-isolation"
        ) from exc
    ext_modules = mypycify(COMPILED_MODULES, opt_level="3")

setup(ext_modules=ext_modules)
