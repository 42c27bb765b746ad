"""Noticing clients that leave a JSON request while it is still waiting upstream.

vLLM answers a JSON request in one piece when its generation ends, so a client that leaves
early keeps the engine generating for nobody unless the gateway aborts the upstream request.
Most answers come back in milliseconds, though, and watching each request for a disconnect
costs it a task, a timer even ~3 us: one coarse sweep starts the watcher of the requests
that have waited `delay_s`, for the price of a dict entry each (a timing wheel of one slot).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.coarse_timers import CoarseTimers
from gateway.proxy.channel import ClientChannel


class DepartureWatch:
    """Starts `ClientChannel.watch_disconnect` for requests pending longer than `delay_s`.

    A departed client is noticed between `delay_s` and 1.5 x `delay_s` after its request
    started. The sweep runs only while something is pending.
    """

    def __init__(self, delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timers = CoarseTimers(delay_s, clock)
        self.delay_s = delay_s

    def add(self, channel: ClientChannel, on_disconnect: Callable[[], None]) -> None:
        self._timers.add(channel, channel.watch_disconnect, on_disconnect)

    def discard(self, channel: ClientChannel) -> None:
        self._timers.discard(channel)

    @property
    def pending(self) -> int:
        return self._timers.pending

    def sweep_once(self) -> None:
        """Starts the watchers that are due; the sweep task calls it, tests may too."""
        self._timers.sweep_once()


__all__ = ["DepartureWatch"]
