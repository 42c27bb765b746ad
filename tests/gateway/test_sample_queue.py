"""The listeners' queue of captured exchanges holds a bounded number of bytes, not only a
bounded number of exchanges: each holds its whole request and answer."""

from __future__ import annotations

import asyncio
import dataclasses

from gateway.sample_queue import SampleQueue
from gateway.stats import CompletedExchange


def test_the_queue_refuses_past_either_bound_and_frees_what_it_hands_out() -> None:
    async def scenario() -> None:
        queue: SampleQueue[str] = SampleQueue(max_bytes=100)
        assert queue.offer("a", 60, max_items=10) and queue.offer("b", 40, max_items=10)
        assert not queue.offer("c", 1, max_items=10)  # 101 bytes
        assert not queue.offer("d", 0, max_items=2)  # a third item
        assert await queue.take() == "a" and queue.bytes == 40
        assert queue.offer("e", 60, max_items=10)
        assert [queue.get_nowait(), queue.get_nowait()] == ["b", "e"] and queue.bytes == 0

    asyncio.run(scenario())


def test_an_exchange_larger_than_the_bound_waits_only_for_an_empty_queue() -> None:
    """Never refused for good: alone in the queue it is taken, whatever its size."""
    queue: SampleQueue[str] = SampleQueue(max_bytes=100)
    assert queue.offer("huge", 500, max_items=10)
    assert not queue.offer("small", 1, max_items=10)
    queue.get_nowait()
    assert queue.offer("small", 1, max_items=10)


def test_an_exchanges_size_is_its_request_and_its_answer() -> None:
    exchange = CompletedExchange("t", "chat", "a", 0, {}, b"x" * 300, None, None, "router")
    assert dataclasses.replace(exchange, request_bytes=1200).size == 1500
