"""Noticing clients that leave a JSON request while it is still waiting upstream.

vLLM answers a JSON request in one piece when its generation ends, so a client that leaves
early keeps the engine generating for nobody unless the gateway aborts the upstream request.
Most answers come back in milliseconds, though, and watching each request for a disconnect
costs it a task, a timer even ~3 us: one coarse sweep starts the watcher of the requests
that have waited `delay_s`, for the price of a dict entry each (a timing wheel of one slot).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.proxy.channel import ClientChannel


class DepartureWatch:
    """Starts `ClientChannel.watch_disconnect` for requests pending longer than `delay_s`.

    A departed client is noticed between `delay_s` and 1.5 x `delay_s` after its request
    started. The sweep runs only while something is pending.
    """

    def __init__(self, delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if delay_s <= 0:
            raise ValueError("delay_s must be positive")
        self.delay_s = delay_s
        self._clock = clock
        # Insertion order is start order: the sweep stops at the first request not yet due.
        self._pending: dict[ClientChannel, tuple[float, Callable[[], None]]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, channel: ClientChannel, on_disconnect: Callable[[], None]) -> None:
        self._pending[channel] = (self._clock(), on_disconnect)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def discard(self, channel: ClientChannel) -> None:
        self._pending.pop(channel, None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def _sweep(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(self.delay_s / 2)
                self.sweep_once()
        finally:
            self._sweeper = None

    def sweep_once(self) -> None:
        """Starts the watchers that are due; the sweep task calls it, tests may too."""
        due_before = self._clock() - self.delay_s
        due: list[ClientChannel] = []
        for channel, (since, _) in self._pending.items():
            if since > due_before:
                break
            due.append(channel)
        for channel in due:
            _, on_disconnect = self._pending.pop(channel)
            channel.watch_disconnect(on_disconnect)


__all__ = ["DepartureWatch"]
