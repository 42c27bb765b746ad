"""Shared fixtures: one ladder of simulated tiers per session, a gateway per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import GatewayThread, Ladder


@pytest.fixture(scope="session")
def ladder() -> Iterator[Ladder]:
    """nvfp4, w4a16, bf16 simulators shared by every test that only reads from them."""
    running = Ladder.start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def gw(ladder: Ladder) -> Iterator[GatewayThread]:
    with GatewayThread(ladder.settings()) as running:
        yield running
