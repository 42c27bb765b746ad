"""The figure script runs and writes its three PNGs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "costmodel_figures.py"


@pytest.mark.slow
def test_figures(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, timeout=120)
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert names == [
        "costmodel_precision_ratio.png",
        "costmodel_r_star.png",
        "costmodel_rho_star.png",
    ]
    assert all(p.stat().st_size > 10_000 for p in tmp_path.glob("*.png"))
