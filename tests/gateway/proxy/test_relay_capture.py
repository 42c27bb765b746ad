"""What the relay keeps of a stream for the shadow judge: every event the client got."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.backends.h1client import UpstreamResponse
from gateway.proxy.channel import ClientChannel
from gateway.proxy.relay import Exchange, relay_stream
from gateway.routing.policy import Decision
from gateway.stats import Ladder, RequestRecord


class _Stream:
    """An upstream stream of fixed reads that then ends."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = list(reads)

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        if not self.reads:
            raise StopAsyncIteration
        return self.reads.pop(0)

    def abort(self) -> None:
        pass


def test_a_last_event_without_its_blank_line_is_captured_too() -> None:
    """An upstream that ends without the blank line after its last event: the client gets
    that event, and so does the capture the shadow judge reads (it was left out, and the
    judge saw a shortened answer)."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {}

    first = b'data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n'
    last = b'data: {"choices":[{"index":0,"delta":{"content":" world"}}]}'
    record = RequestRecord(tenant="t", kind="chat", ladder=Ladder(("a",), (1.0,)))
    exchange = Exchange(
        "chat", {}, Decision(0, None, "pinned"), ClientChannel(send, receive), 0.0, record
    )
    exchange.captured = []

    async def run() -> None:
        response: UpstreamResponse = _Stream([first, last])  # type: ignore[assignment]
        await relay_stream(exchange, response, stall_s=60.0)

    asyncio.run(run())
    relayed = b"".join(message.get("body", b"") for message in sent)
    assert b" world" in relayed
    assert b"".join(exchange.captured).count(b'"content"') == 2
