"""What the relay keeps of a stream for the shadow judge: every event the client got."""

from __future__ import annotations

import asyncio

from gateway.backends.h1client import UpstreamResponse
from gateway.proxy.relay import relay_stream
from tests.gateway.proxy.exchanges import pinned_exchange, relayed_body


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
    first = b'data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n'
    last = b'data: {"choices":[{"index":0,"delta":{"content":" world"}}]}'
    exchange, sent = pinned_exchange()
    exchange.captured = []
    response: UpstreamResponse = _Stream([first, last])  # type: ignore[assignment]
    asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    assert b" world" in relayed_body(sent)
    assert b"".join(exchange.captured).count(b'"content"') == 2
