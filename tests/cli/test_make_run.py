"""`make run`: the ports a new user can move without leaving make."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_moves_the_gateway_and_the_simulated_tiers() -> None:
    """`up` refuses to start when 9001-9003 are taken and names --sim-base-port, which a
    `make run` user could not pass: the Makefile has to carry it as it carries PORT."""
    dry_run = subprocess.run(
        ["make", "-n", "--no-print-directory", "run", "PORT=8123", "SIM_BASE_PORT=9123"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "tiergate up --port 8123 --sim-base-port 9123" in dry_run.stdout
