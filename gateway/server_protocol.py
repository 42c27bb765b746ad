"""uvicorn's httptools protocol with bounds on a request's head: its size and its time.

httptools keeps a request line and its headers in memory until the blank line that ends
them, however long they grow: one client could hold hundreds of megabytes per connection
with one endless header, before any API key is looked at. Past `MAX_HEAD_BYTES` the
connection gets a 400 and is closed.

A request httptools cannot parse (a NUL in a header, a Content-Length beside a
Transfer-Encoding, a bad chunk size) gets a 400 in OpenAI's error shape naming the parser's
reason, not uvicorn's plain-text "Invalid HTTP request received.". When the unparsable
request follows one still being served on the same connection (pipelined, or sent while a
stream runs), the 400 waits for that answer: written at once, it closed the connection and
lost the earlier request's answer, or cut into its stream.

The trailer section after a chunked body's last chunk is a head of its own, kept as headers
in memory by httptools and uvicorn however long it grows: past `MAX_HEAD_BYTES` it gets the
same 400. Its time is the body's (`limits.body_timeout_s`, or the bound below once
answered).

An HTTP/1.1 request without a Host header, or with several, gets the same 400 (RFC 9112
3.2: a server MUST refuse it); HTTP/1.0 needs none.

A request sent with `Expect: 100-continue` is answered with `Connection: close`, and the
connection closed, when the answer starts before any of its body came (a 401 on a wrong
key): the client may never send that body, or send it late, and kept alive, the connection
read the client's next request as that body.

uvicorn times out idle keep-alive connections, not a head that trickles in (slowloris): a
connection whose head is not whole `HEAD_TIMEOUT_S` after it began is closed. One coarse
sweep per event loop checks (`CoarseTimers`), so it is closed 30-45 s in; a timer per
request would cost more than the rest of the head's handling. The same bound applies to the
rest of a body answered before it was whole (a 401 on a wrong key): uvicorn drops it as it
comes, and each byte stopped its keep-alive timer, so a trickle held the connection for good.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from typing import Final

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.coarse_timers import CoarseTimers
from gateway.errors import InvalidRequestError

# Generous beside what an OpenAI client sends (a few hundred bytes) or an Ingress passes on
# (nginx: 32 KiB by default). Reads are counted whole, so the bound is met one read
# (at most 256 KiB with uvloop) after the limit.
MAX_HEAD_BYTES: Final = 1 << 20
# nginx's client_header_timeout is 60 s; a client on any real link sends a head at once.
HEAD_TIMEOUT_S = 30.0

_head_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CoarseTimers] = (
    weakref.WeakKeyDictionary()
)


def _deadlines(loop: asyncio.AbstractEventLoop) -> CoarseTimers:
    timers = _head_deadlines.get(loop)
    if timers is None:
        timers = _head_deadlines[loop] = CoarseTimers(HEAD_TIMEOUT_S)
    return timers


def _head_timed_out(protocol: BoundedHeadProtocol) -> None:
    protocol._armed = False
    if not protocol._in_head or protocol.transport is None:
        return
    flow = protocol.flow
    cycle = protocol.cycle
    if (flow is not None and flow.read_paused) or (
        cycle is not None and not cycle.response_complete
    ):
        # An earlier request is still being served (uvicorn may have stopped reading): the
        # head's slowness is not yet the client's, and closing would lose that request's
        # answer. Look again a sweep later.
        protocol._deadlines.add(protocol, _head_timed_out, protocol)
        protocol._armed = True
        return
    protocol.transport.close()


def _unread_body_timed_out(protocol: BoundedHeadProtocol) -> None:
    protocol._armed = False
    if protocol._in_head or protocol.transport is None:
        return  # the body has ended since
    protocol.transport.close()


_uvicorn_on_body = HttpToolsProtocol.on_body


class BoundedHeadProtocol(HttpToolsProtocol):
    """Counts the bytes and the time a request's head takes; refuses it past either bound."""

    _in_head = True  # reading a head: from the connection's start or the last message's end
    _head_bytes = 0
    _armed = False  # a head deadline is pending
    _refusal: bytes | None = None  # a 400 held until the requests before it are answered
    _hosts = 0  # Host headers in the head being read
    # A chunk's size line came and none of its data since: the last chunk's trailers follow.
    _after_chunk_header = False
    _trailer_bytes = 0
    # A request waiting on `100 Continue`: the keep-alive it asked for, held back until its
    # body begins to come (None: none waiting).
    _keep_alive_once_sent: bool | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadlines = _deadlines(self.loop)
        self._deadlines.add(self, _head_timed_out, self)
        self._armed = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadlines.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return  # the parser has failed: nothing after that point is a request
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self.send_400_response("Request line and headers are too large.")
                return
        elif self._after_chunk_header:
            # Counted whole from the read after a chunk's size line: a chunk with data ends
            # the count within that read (on_body), far below the bound.
            self._trailer_bytes += len(data)
            if self._trailer_bytes > MAX_HEAD_BYTES:
                self.send_400_response("The chunked body's trailer section is too large.")
                return
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a request it cannot parse, as OpenAI-shaped JSON: clients and
        SDKs read `error.message`, and uvicorn's own body is plain text with no reason."""
        # uvicorn calls this inside its `except httptools.HttpParserError`: the parser's
        # own reason ("Invalid header value char", "Duplicate Content-Length") says more.
        reason = sys.exception()
        if isinstance(reason, httptools.HttpParserCallbackError) and isinstance(
            reason.__context__, httptools.HttpParserError
        ):
            # "User callback error": uvicorn's callback refused a part (the request target,
            # e.g. `CONNECT host:443`); the parser's error it raised says which.
            reason = reason.__context__
        message = f"Invalid HTTP request: {reason}." if reason is not None else msg
        body = InvalidRequestError(message, code="invalid_http_request").body()
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        head += [
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        ]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        answer = b"".join(head) + body
        if self._in_head and self.cycle is not None and not self.cycle.response_complete:
            # The bad bytes begin a request after one not yet answered: answer that first.
            self._refusal = answer
            self._deadlines.discard(self)  # this head is judged; its slowness is moot
            self._armed = False
            return
        self._refuse(answer)

    def _refuse(self, answer: bytes) -> None:
        assert self.transport is not None  # connected: data arrived
        self.transport.write(answer)
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next pipelined request, if any
        if self.transport.is_closing():
            return  # the answer closed the connection (HTTP/1.0, `connection: close`)
        if self._refusal is not None:
            if not self.pipeline and self.cycle.response_complete:
                self._refuse(self._refusal)
        elif not self._in_head and self.cycle.response_complete and not self._armed:
            # Answered before its body was whole: the rest gets as long as a head would.
            self._deadlines.add(self, _unread_body_timed_out, self)
            self._armed = True

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._hosts = 0
        if not self._armed:  # the next request on a kept-alive connection
            self._deadlines.add(self, _head_timed_out, self)
            self._armed = True

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's own, with a count of Host headers: one comparison more a header, where
        # counting them in on_headers_complete took a scan of all of them.
        name = name.lower()
        if name == b"host":
            self._hosts += 1
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._hosts != 1 and self.parser.get_http_version() == "1.1":
            # Raised here, it is refused as any head the parser rejects (send_400_response).
            raise httptools.HttpParserError(
                f"an HTTP/1.1 request needs exactly one Host header, not {self._hosts}"
            )
        self._in_head = False
        self._deadlines.discard(self)
        self._armed = False
        super().on_headers_complete()
        if self.expect_100_continue and self.cycle.scope is self.scope:
            # Answered before its body comes, the connection closes (the body may be unsent).
            self._keep_alive_once_sent = self.cycle.keep_alive
            self.cycle.keep_alive = False

    def shutdown(self) -> None:
        self._keep_alive_once_sent = None  # the server closes it: a body coming keeps it not
        super().shutdown()

    def on_chunk_header(self) -> None:
        self._after_chunk_header = True
        self._trailer_bytes = 0

    def on_body(self, body: bytes) -> None:
        self._after_chunk_header = False
        if self._keep_alive_once_sent is not None:
            self._body_comes()
        _uvicorn_on_body(self, body)  # super() costs ~150 ns more, on every body read

    def _body_comes(self) -> None:
        """The body of a request that waited on `100 Continue` comes: its connection stays
        as the request asked, unless the answer (with `connection: close`) has begun."""
        if not self.cycle.response_started:
            self.cycle.keep_alive = bool(self._keep_alive_once_sent)
        self._keep_alive_once_sent = None

    def on_message_complete(self) -> None:
        if self._keep_alive_once_sent is not None:  # an empty body: nothing is left unsent
            self._body_comes()
        if self._armed:  # the rest of an answered body came in time
            self._deadlines.discard(self)
            self._armed = False
        self._in_head = True  # what arrives next is the next request's head
        self._head_bytes = 0
        self._after_chunk_header = False
        super().on_message_complete()


__all__ = ["HEAD_TIMEOUT_S", "MAX_HEAD_BYTES", "BoundedHeadProtocol"]
