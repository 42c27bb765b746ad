"""Shared fixtures: one ladder of simulated tiers per session, a gateway per module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers import ENGINE_KEY, SHARED_DATA, GatewayThread, Ladder
from tests.vllm.preparation import Preparation

# Property tests check results, not speed: Hypothesis's default 200 ms deadline per
# example (and its too-slow health check) fail a run where the host stalled one example,
# a full garbage collection of this process or another test's processes on 2 cores
# ("Unreliable test timings"). Where speed matters a test times it itself.
settings.register_profile("tiergate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tiergate")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data` next to the repository: missing fails in CI, skips elsewhere."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared data missing at {SHARED_DATA}")
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def vllm_preparation(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Preparation | None]:
    """When the session selects tests/vllm, starts preparing the real vLLM deployment at its
    first test, so the install and start-up overlap the other tests (tests/vllm/preparation.py).
    """
    if not any(item.get_closest_marker("vllm") for item in request.session.items):
        yield None
        return
    preparation = Preparation(tmp_path_factory.mktemp("vllm-logs")).start()
    yield preparation
    left = preparation.close()  # when the vllm tests did not run: stop what was started
    assert not left, f"vLLM processes survived the session: {left}"


@pytest.fixture(scope="session")
def ladder() -> Iterator[Ladder]:
    """nvfp4, w4a16, bf16 simulators shared by every test that only reads from them."""
    running = Ladder.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def keyed_ladder() -> Iterator[Ladder]:
    """nvfp4 and bf16 simulators started with --api-key ENGINE_KEY."""
    running = Ladder.start(("nvfp4", "bf16"), extra_args=("--api-key", ENGINE_KEY))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def gw(ladder: Ladder) -> Iterator[GatewayThread]:
    with GatewayThread(ladder.settings()) as running:
        yield running
