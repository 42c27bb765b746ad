"""The coarse sweep that starts disconnect watchers of JSON requests waiting upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.proxy.channel import ClientChannel
from gateway.proxy.departures import DepartureWatch


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _channel(gone: asyncio.Event) -> ClientChannel:
    async def send(message: dict[str, Any]) -> None:
        return None

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    return ClientChannel(send, receive)


def test_only_requests_pending_longer_than_the_delay_are_watched() -> None:
    async def scenario() -> None:
        clock = _Clock()
        watch = DepartureWatch(0.2, clock)
        gone = asyncio.Event()
        aborted: list[str] = []
        old, young, done = _channel(gone), _channel(gone), _channel(gone)
        watch.add(old, lambda: aborted.append("old"))
        clock.now += 0.15
        watch.add(young, lambda: aborted.append("young"))
        watch.add(done, lambda: aborted.append("done"))
        watch.discard(done)  # answered in time: never watched
        clock.now += 0.1  # old has waited 0.25 s, young 0.1 s
        watch.sweep_once()
        assert watch.pending == 1
        gone.set()  # every client leaves
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert aborted == ["old"] and old.disconnected and not young.disconnected
        clock.now += 0.15
        watch.sweep_once()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert aborted == ["old", "young"] and watch.pending == 0

    asyncio.run(scenario())


def test_a_delay_must_be_positive() -> None:
    with pytest.raises(ValueError):
        DepartureWatch(0.0)
