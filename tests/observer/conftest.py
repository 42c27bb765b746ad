"""Shared data for observer tests, found next to the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared data missing at {SHARED_DATA}")
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
