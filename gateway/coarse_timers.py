"""A timing wheel of one slot: many short-lived waits, one sweep, a dict entry each.

Per-request timers on the hot path cost a heap entry and a cancel each (a few microseconds
with uvloop). Most of these waits end long before their deadline, so one sweep every
`delay_s / 2` fires the entries older than `delay_s` instead: an entry fires between
`delay_s` and 1.5 x `delay_s` after it was added. The sweep runs while entries are pending
and ends at the first tick that finds none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger("tiergate")


class CoarseTimers:
    """Calls `callback(argument)` for every entry still pending `delay_s` after `add`."""

    def __init__(self, delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if delay_s <= 0:
            raise ValueError("delay_s must be positive")
        self.delay_s = delay_s
        self._clock = clock
        # Insertion order is start order: the sweep stops at the first entry not yet due.
        self._pending: dict[Hashable, tuple[float, Callable[[Any], object], Any]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, key: Hashable, callback: Callable[[Any], object], argument: Any) -> None:
        self._pending[key] = (self._clock(), callback, argument)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def discard(self, key: Hashable) -> bool:
        """Forgets `key`; True when it was still pending (its callback has not run)."""
        return self._pending.pop(key, None) is not None

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def sweeping(self) -> bool:
        """Whether the sweep task runs (only while entries are pending)."""
        return self._sweeper is not None

    async def _sweep(self) -> None:
        # Sleeps before it looks: most entries are discarded before the task first runs, and
        # a sweep that found nothing pending and ended at once was a new task per request.
        try:
            while True:
                await asyncio.sleep(self.delay_s / 2)
                if not self._pending:
                    return
                self.sweep_once()
        finally:
            self._sweeper = None

    def sweep_once(self) -> None:
        """Fires the entries that are due; the sweep task calls it, tests may too."""
        due_before = self._clock() - self.delay_s
        due: list[Hashable] = []
        for key, (since, _, _) in self._pending.items():
            if since > due_before:
                break
            due.append(key)
        for key in due:
            _, callback, argument = self._pending.pop(key)
            try:
                callback(argument)
            except Exception:  # one failing callback must not stop the sweep for the rest
                log.exception("a coarse timer's callback failed")


__all__ = ["CoarseTimers"]
