"""Sleeping out a period that a reload may change while the sleep runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

# How often a sleep re-reads its period: a reload that shortens it takes effect within this.
RECHECK_S: Final = 1.0


async def sleep_period(
    period_s: Callable[[], float], clock: Callable[[], float] = time.monotonic
) -> None:
    """Sleeps until `period_s()` seconds have passed since the call, re-reading the period at
    least every RECHECK_S. A plain sleep of the period read at the start ran out first: a
    reload from a 600 s interval to 1 s took effect only up to 600 s later."""
    started = clock()
    while (left := started + period_s() - clock()) > 0:
        await asyncio.sleep(min(left, RECHECK_S))


__all__ = ["RECHECK_S", "sleep_period"]
