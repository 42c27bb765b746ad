"""A lean HTTP/1.1 client for the upstream hop, built on asyncio protocols and httptools.

Why not aiohttp or httpx: on this hop every microsecond is paid per request.
`benchmarks/upstream_client.py` runs the lean pass-through on this client and on aiohttp's
pooled ClientSession (no cookie jar, no decompression) against the same fake backend, in
interleaved blocks: 39 us of CPU per proxied JSON request against 154 us, 89 us per 16-chunk
stream against 232 us (2026-11-30, the 2-core development machine); httpx costs more than
aiohttp (encode/httpx#3215).
The parser is httptools (llhttp), the one uvicorn uses, so the protocol edge cases (chunked
encoding, keep-alive rules) are handled by a well-kept library; this module only adds
pooling, timeouts, flow control and cancellation.

Contract:
- `ConnectionPool.request` returns once the response headers arrived (the "first byte").
- A failure before that raises `UpstreamConnectError`, `UpstreamTimeout` or
  `UpstreamProtocolError`; the request never reached the client, so the caller may retry.
- The body is consumed with `async for chunk in response` or `await response.read(limit)`;
  a failure then raises from the iterator and the connection is discarded.
- `response.release()` returns a cleanly finished keep-alive connection to the pool;
  `response.abort()` drops it (client went away: the upstream sees the disconnect).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Final, cast

import httptools

# Pause reading from upstream above 1 MiB buffered; resume once the consumer took it all.
_HIGH_WATER: Final = 1 << 20
# An engine's head is a few hundred bytes. httptools keeps a header line whole, however
# long, joined piece by piece (time quadratic in its length): past this bound the answer is
# refused. Reads are counted whole, so it is met one read after the bound.
_MAX_HEAD_BYTES: Final = 1 << 20


class UpstreamFailure(Exception):
    """Base of the errors this client raises."""


class UpstreamConnectError(UpstreamFailure):
    """Connection refused, reset or closed before the response headers."""


class UpstreamTimeout(UpstreamFailure):
    """Connect, first-byte or total deadline passed; `total` says it was the total one (the
    caller's deadline for the whole exchange, not the upstream's time to answer)."""

    def __init__(self, message: str, *, total: bool = False) -> None:
        super().__init__(message)
        self.total = total


class UpstreamAborted(UpstreamFailure):
    """The gateway dropped the exchange itself (its client left): no fault of the upstream."""


class UpstreamProtocolError(UpstreamFailure):
    """The upstream spoke broken HTTP, or sent more than the caller allows."""


class UpstreamTooLarge(UpstreamProtocolError):
    """The answer is longer than the caller allows."""


class UpstreamResponse:
    """Status, headers and a body that arrives in chunks."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_complete",
        "_conn",
        "_error",
        "_loop",
        "_waiter",
        "headers",
        "keep_alive",
        "status",
    )

    def __init__(self, conn: _Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn: _Connection | None = conn
        # Kept, not looked up: asyncio.get_running_loop() costs a getpid() system call.
        self._loop = loop
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- fed by the protocol ------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _finish(self) -> None:
        self._complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self._complete and self._error is None:
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- consumer side ------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return self._complete

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._complete:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        # Everything that has arrived goes out as one piece: the parser cuts one TCP read
        # into one chunk per HTTP chunk, and relaying them one by one would cost a client
        # write each. Nothing waits for more data, so no latency is added; under load, when
        # several events queue up per connection, the gateway does less work per event.
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._conn is not None:
            self._conn.resume()
        return data

    @property
    def has_body(self) -> bool:
        """Whether body bytes wait unread, or the body has ended."""
        return self._buffered > 0 or self._complete

    @property
    def reading_paused(self) -> bool:
        """Whether the unread body has filled the buffer: nothing more arrives until read."""
        return self._buffered > _HIGH_WATER

    def body_so_far(self) -> bytes:
        """What has arrived of the body and is not read yet (it stays to be read)."""
        return b"".join(self._chunks)

    async def wait_for_body(self, after: int = 0) -> None:
        """Returns once more than `after` bytes of the body wait unread, or it has ended;
        raises its failure."""
        while self._buffered <= after and not self._complete:
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read(self, limit: int) -> bytes:
        """The whole body; raises UpstreamProtocolError when it exceeds `limit` bytes."""
        if self._complete and self._error is None and self._buffered <= limit:
            # Usual for JSON answers: the whole body came with the headers.
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._buffered = 0
            return data
        parts: list[bytes] = []
        size = 0
        async for chunk in self:
            size += len(chunk)
            if size > limit:
                self.abort()
                raise UpstreamTooLarge(f"upstream response exceeds {limit} bytes")
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Hands the connection back for reuse when the exchange finished cleanly."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._complete and self.keep_alive and self._error is None:
            conn.finish_exchange()
        else:
            conn.close()

    def abort(self) -> None:
        """Drops the connection at once; the upstream server sees the client go away. Works
        before the headers are in too: the wait for them ends with UpstreamAborted."""
        conn, self._conn = self._conn, None
        error = UpstreamAborted("aborted by the gateway")
        if conn is not None:
            if conn.response is self:
                conn.fail(error)
            conn.abort()
        self._fail(error)


def _ends_at_close(response: UpstreamResponse) -> bool:
    """An answer whose headers are in and whose body runs until the connection closes."""
    if not response.status or response.complete:
        return False
    return response.header(b"content-length") is None and (
        response.header(b"transfer-encoding") is None
    )


def _faulty_framing(parser: httptools.HttpResponseParser, response: UpstreamResponse) -> bool:
    """An HTTP/1.0 answer with Transfer-Encoding (which 1.0 lacks): its framing is faulty,
    and its connection must close once it is read (RFC 9112, 6.1)."""
    return response.header(b"transfer-encoding") is not None and parser.get_http_version() == "1.0"


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_head_bytes",
        "_interim",
        "_parser",
        "_paused",
        "_pool",
        "closed",
        "response",
        "timer",
        "tls",
        "transport",
        "waiter",
    )

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        # The context the connection was opened with: once a reload changes the pool's,
        # this connection is not reused (it was verified against the old CA).
        self.tls = pool.tls
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self._paused = False
        self._interim = False  # the answer being parsed is a 1xx one: the final one follows
        self._head_bytes = 0  # of the answer to the request outstanding, until its status

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport implements asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:
            # Bytes with no request outstanding: the connection is out of sync, drop it.
            self.abort()
            return
        if not response.status:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # A callback's own refusal comes wrapped as "User callback error": told as it is.
            cause = exc.__context__
            if not isinstance(cause, UpstreamProtocolError):
                cause = UpstreamProtocolError(f"bad HTTP from upstream: {exc}")
            self.fail(cause)
            self.abort()
        except httptools.HttpParserUpgrade:
            # A 101 (or `connection: upgrade`) to a request that asked for no upgrade. Not
            # an HttpParserError: left to escape, the event loop would close the transport
            # as a fatal error, read as a stale connection and sent again.
            self.fail(UpstreamProtocolError("upstream switched protocols unasked"))
            self.abort()
        else:
            if not response.status and self._head_bytes > _MAX_HEAD_BYTES:
                self.fail(UpstreamProtocolError(f"upstream head over {_MAX_HEAD_BYTES} bytes"))
                self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        response = self.response
        if exc is None and response is not None and _ends_at_close(response):
            # No length and not chunked: HTTP/1.1 ends such a body when the server closes
            # (httptools has no end-of-input call to say so). A proxy may answer this way.
            response.keep_alive = False
            response._finish()
            return
        if response is not None and (response.status or self._head_bytes):
            # Once the answer has begun (a 1xx, part of the headers), a closed connection is
            # a cut answer, not an unreachable endpoint, and must not be retried as a stale
            # keep-alive connection: the engine had the request.
            self.fail(UpstreamProtocolError("upstream closed the connection mid-answer"))
        else:
            self.fail(UpstreamConnectError("upstream closed the connection"))

    # -- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        response = self.response
        if response is not None and response.complete:
            # A second answer to one request: the connection is out of sync. Raising stops
            # the parser (data_received drops the connection) before the extra answer's
            # headers or body land in this one, or its tail waits for the next request.
            raise UpstreamProtocolError("upstream sent more than one answer to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        # Once the status is set the headers are complete: what follows is a chunked body's
        # trailer section, whose fields must not pass for header fields (a content-type).
        if response is not None and not response.status:
            response.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        status = self._parser.get_status_code()
        if status < 100:
            # llhttp takes any three digits; below 100 is no status, and read as an interim
            # answer its body would open the final answer's.
            raise UpstreamProtocolError(f"upstream sent status {status:03d}")
        if status < 200:
            # An interim answer (100 Continue, 103 Early Hints from a proxy): not the answer
            # to wait for, nor a second one (`on_message_begin`).
            response.headers.clear()
            self._interim = True
            return
        response.status = status
        response.keep_alive = self._parser.should_keep_alive() and not _faulty_framing(
            self._parser, response
        )
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._cancel_timer()
        if self.response is not None:
            self.response._finish()

    # -- used by the pool and the response ----------------------------------------------
    def start(self, request: bytes, response: UpstreamResponse) -> None:
        self.response = response
        self._parser = httptools.HttpResponseParser(self)
        self._interim = False
        self._head_bytes = 0
        assert self.transport is not None
        self.transport.write(request)

    def finish_exchange(self) -> None:
        self.response = None
        self._cancel_timer()
        self.resume()
        self._pool.give_back(self)

    def fail(self, error: UpstreamFailure) -> None:
        """Fails the outstanding exchange: the header wait if pending, else the body."""
        if self.response is not None:
            self.response._fail(error)
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()


class ConnectionPool:
    """Keep-alive connections to one upstream endpoint (host, port)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float = 3.0,
        max_idle: int = 512,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        # For https endpoints: new connections are TLS with this context; replaced on reload.
        self.tls = tls
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._host_header = f"{host}:{port}".encode()
        # Header lines on every request from this pool (the tier's API key); replaced on reload.
        self.default_headers = b""

    def render(self, method: bytes, path: bytes, body: bytes, extra_headers: bytes = b"") -> bytes:
        """A complete HTTP/1.1 request; extra_headers are pre-rendered `name: value\\r\\n` lines."""
        return b"".join(
            (
                method,
                b" ",
                path,
                b" HTTP/1.1\r\nhost: ",
                self._host_header,
                b"\r\ncontent-type: application/json\r\ncontent-length: ",
                str(len(body)).encode(),
                b"\r\n",
                self.default_headers,
                extra_headers,
                b"\r\n",
                body,
            )
        )

    async def request(
        self,
        request: bytes,
        *,
        first_byte_timeout_s: float,
        total_timeout_s: float,
        started: list[UpstreamResponse] | None = None,
    ) -> UpstreamResponse:
        """Sends a rendered request; returns when the response headers are in.

        The response is appended to `started` as soon as the request is sent, so that its
        owner can `abort()` it while the headers are still awaited.
        """
        conn = self._pop_idle()
        if conn is not None:
            loop = self._loop or self._bind_loop()
            sent_at = loop.time()
            try:
                return await self._exchange(
                    conn, request, first_byte_timeout_s, total_timeout_s, started
                )
            except UpstreamConnectError:
                # A reused connection can be closed by the server just as we write to it
                # (keep-alive expiry): retry fresh. The retry gets only what is left of the
                # timeouts: an engine that dropped the request after working on it must not
                # restart the caller's deadline.
                spent = loop.time() - sent_at
                if spent >= first_byte_timeout_s or spent >= total_timeout_s:
                    raise
                first_byte_timeout_s -= spent
                total_timeout_s -= spent
        # The connect spends the caller's time too: the exchange gets only what it left.
        loop = self._loop or self._bind_loop()
        connecting_at = loop.time()
        conn = await self._connect(first_byte_timeout_s, total_timeout_s)
        spent = loop.time() - connecting_at
        return await self._exchange(
            conn, request, first_byte_timeout_s - spent, total_timeout_s - spent, started
        )

    async def _exchange(
        self,
        conn: _Connection,
        request: bytes,
        first_byte_s: float,
        total_s: float,
        started: list[UpstreamResponse] | None = None,
    ) -> UpstreamResponse:
        loop = self._loop or self._bind_loop()
        response = UpstreamResponse(conn, loop)
        if started is not None:
            started.append(response)
        waiter: asyncio.Future[None] = loop.create_future()
        conn.waiter = waiter
        now = loop.time()
        deadline = now + total_s
        first_byte = now + first_byte_s
        conn.timer = (
            loop.call_at(first_byte, self._timed_out, conn, "first byte")
            if first_byte < deadline
            else loop.call_at(deadline, self._timed_out, conn, "total")
        )
        conn.start(request, response)
        try:
            await waiter
        except BaseException:
            conn.waiter = None
            conn.abort()
            raise
        # Headers are in: from now on only the total deadline applies.
        if conn.timer is not None:
            conn.timer.cancel()
        if not response.complete:
            conn.timer = loop.call_at(deadline, self._timed_out, conn, "total")
        return response

    def _timed_out(self, conn: _Connection, which: str) -> None:
        conn.timer = None
        message = f"upstream {self.host}:{self.port} passed the {which} deadline"
        conn.fail(UpstreamTimeout(message, total=which == "total"))
        conn.abort()

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    async def _connect(self, first_byte_s: float, total_s: float) -> _Connection:
        """A new connection, within connect_timeout_s and within the caller's deadlines."""
        loop = self._bind_loop()
        within = min(first_byte_s, total_s)
        try:
            async with asyncio.timeout(min(self.connect_timeout_s, within)):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls is not None else None,
                )
        except TimeoutError:
            if within < self.connect_timeout_s:
                which = "total" if total_s <= first_byte_s else "first byte"
                raise UpstreamTimeout(
                    f"upstream {self.host}:{self.port} passed the {which} deadline connecting",
                    total=which == "total",
                ) from None
            raise UpstreamTimeout(
                f"connecting to {self.host}:{self.port} took over {self.connect_timeout_s}s"
            ) from None
        except (OSError, UnicodeError) as exc:  # UnicodeError: a host name IDNA cannot encode
            raise UpstreamConnectError(
                f"cannot connect to {self.host}:{self.port}: "
                f"{getattr(exc, 'strerror', None) or exc}"
            ) from None
        return conn

    def _pop_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.tls is not self.tls:
                conn.close()
            elif not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def give_back(self, conn: _Connection) -> None:
        # A closed pool (its endpoint left the configuration) keeps nothing: a request still
        # in flight when it closed would otherwise park its connection here for good.
        if (
            conn.closed
            or self._closed
            or conn.tls is not self.tls
            or len(self._idle) >= self.max_idle
        ):
            conn.close()
        else:
            self._idle.append(conn)

    @property
    def idle_connections(self) -> int:
        return sum(1 for conn in self._idle if not conn.closed)

    def close(self) -> None:
        """Closes the idle connections; those in use close when their exchange ends."""
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()


__all__ = [
    "ConnectionPool",
    "UpstreamAborted",
    "UpstreamConnectError",
    "UpstreamFailure",
    "UpstreamProtocolError",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamTooLarge",
]
