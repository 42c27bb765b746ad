"""The request body's deadline: a cancel of its own, told apart from anyone else's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.api.openai import GenerationHandler
from gateway.coarse_timers import CoarseTimers
from gateway.errors import RequestTimeoutError


def _reader(*, shutdown_too: bool) -> Any:
    async def scenario() -> Any:
        now = [100.0]
        holder = SimpleNamespace(_body_deadlines=CoarseTimers(10.0, lambda: now[0]))
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await never.wait()  # headers came, the body never does
            return {}

        task = asyncio.create_task(GenerationHandler._read_body(holder, receive, 1000))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the handler waits for its body
        now[0] += 11.0
        holder._body_deadlines.sweep_once()  # the deadline cancels it
        if shutdown_too:
            task.cancel()  # and so does a shutdown, before the task runs again
        try:
            return await task
        finally:
            assert holder._body_deadlines.pending == 0

    return asyncio.run(scenario())


def test_the_deadline_alone_is_a_408() -> None:
    with pytest.raises(RequestTimeoutError, match="within 10 s"):
        _reader(shutdown_too=False)


def test_a_shutdown_at_the_same_moment_is_not_swallowed_as_the_deadline() -> None:
    with pytest.raises(asyncio.CancelledError):
        _reader(shutdown_too=True)
