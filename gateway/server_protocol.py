"""uvicorn's httptools protocol with a bound on the size of a request's head.

httptools keeps a request line and its headers in memory until the blank line that ends
them, however long they grow: one client could hold hundreds of megabytes per connection
with one endless header, before any API key is looked at. Past `MAX_HEAD_BYTES` the
connection gets uvicorn's own 400 and is closed.
"""

from __future__ import annotations

from typing import Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Generous beside what an OpenAI client sends (a few hundred bytes) or an Ingress passes on
# (nginx: 32 KiB by default). Reads are counted whole, so the bound is met one read
# (at most 256 KiB with uvloop) after the limit.
MAX_HEAD_BYTES: Final = 1 << 20


class BoundedHeadProtocol(HttpToolsProtocol):
    """Counts the bytes read while a request's head is incomplete; refuses it past the bound."""

    _in_head = True  # a connection starts by waiting for a head
    _head_bytes = 0

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self.send_400_response("Request line and headers are too large.")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()


__all__ = ["MAX_HEAD_BYTES", "BoundedHeadProtocol"]
