"""The upstream HTTP/1.1 client against a raw socket server scripted per test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.backends.h1client import (
    ConnectionPool,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from tests.helpers import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def with_server(handler: Handler, body: Callable[[ConnectionPool], Awaitable[None]]) -> None:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = ConnectionPool("127.0.0.1", port, connect_timeout_s=1.0)
    try:
        await body(pool)
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


def request(pool: ConnectionPool, payload: bytes = b'{"x":1}') -> bytes:
    return pool.render(b"POST", b"/v1/chat/completions", payload)


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
        % (
            len(body),
            extra,
            body,
        )
    )


def test_keep_alive_connection_is_reused() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(ok(b'{"ok":true}'))
            await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        for _ in range(5):
            response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
            assert response.status == 200
            assert await response.read(1 << 20) == b'{"ok":true}'
            response.release()
        assert connections == 1
        assert pool.idle_connections == 1

    asyncio.run(with_server(handler, body))


def test_chunked_body_is_decoded_and_streamed() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in (b"data: a\n\n", b"data: b\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        chunks = [chunk async for chunk in response]
        assert b"".join(chunks) == b"data: a\n\ndata: b\n\n"
        assert len(chunks) == 2  # arrived as two pieces, relayed as they came
        response.release()

    asyncio.run(with_server(handler, body))


def test_chunks_that_arrive_together_are_relayed_as_one_piece() -> None:
    pieces = [b"data: %d\n\n" % i for i in range(16)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        # One write: the client reads it at once and gets 16 HTTP chunks from its parser.
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        writer.write(head + chunked + b"0\r\n\r\n")
        await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        await asyncio.sleep(0.05)  # everything is in before the consumer looks
        chunks = [chunk async for chunk in response]
        assert chunks == [b"".join(pieces)]
        response.release()
        assert pool.idle_connections == 1

    asyncio.run(with_server(handler, body))


def test_a_slow_consumer_pauses_the_upstream_and_gets_every_byte() -> None:
    piece = b"x" * 65536
    count = 64  # 4 MiB: past the 1 MiB high-water mark

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (len(piece) * count))
        for _ in range(count):
            writer.write(piece)
            await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=10)
        await asyncio.sleep(0.2)
        total = 0
        async for chunk in response:
            # Reading paused at the high-water mark, so no single piece is the whole body.
            assert len(chunk) < len(piece) * count
            total += len(chunk)
            await asyncio.sleep(0.001)
        assert total == len(piece) * count
        response.release()

    asyncio.run(with_server(handler, body))


def test_connection_refused_is_a_connect_error() -> None:
    async def main() -> None:
        pool = ConnectionPool("127.0.0.1", free_port(), connect_timeout_s=1.0)
        with pytest.raises(UpstreamConnectError):
            await pool.request(request(pool), first_byte_timeout_s=1, total_timeout_s=1)

    asyncio.run(main())


def test_first_byte_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async def body(pool: ConnectionPool) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UpstreamTimeout, match="first byte"):
            await pool.request(request(pool), first_byte_timeout_s=0.2, total_timeout_s=5)
        assert loop.time() - started < 1.0

    asyncio.run(with_server(handler, body))


def test_total_timeout_interrupts_a_stalled_body() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(5)

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=0.3)
        with pytest.raises(UpstreamTimeout, match="total"):
            await response.read(1 << 20)

    asyncio.run(with_server(handler, body))


def test_close_mid_body_fails_the_stream() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n")
        await writer.drain()
        writer.close()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        received = []
        with pytest.raises(UpstreamProtocolError, match="mid-answer"):
            async for chunk in response:
                received.append(chunk)
        assert received == [b"data: a\n\n"]
        response.release()
        assert pool.idle_connections == 0  # a broken connection is never reused

    asyncio.run(with_server(handler, body))


def test_a_body_delimited_by_the_close_of_the_connection_is_whole() -> None:
    """No content-length, not chunked: HTTP/1.1 ends the body when the server closes (a
    proxy in front of an engine may answer so). It was a protocol error, failed over."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
        writer.write(b"connection: close\r\n\r\n" + b'{"choices": []}')
        await writer.drain()
        writer.close()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        assert await response.read(1 << 20) == b'{"choices": []}'
        response.release()
        assert pool.idle_connections == 0

    asyncio.run(with_server(handler, body))


def test_stale_keep_alive_connection_is_retried_on_a_fresh_one() -> None:
    served = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(ok(b"{}"))
        await writer.drain()
        writer.close()  # the server drops keep-alive connections after each response

    async def body(pool: ConnectionPool) -> None:
        for _ in range(3):
            response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
            await response.read(1024)
            response.release()
            await asyncio.sleep(0.05)
        assert served == 3

    asyncio.run(with_server(handler, body))


def test_oversized_body_and_garbage_are_protocol_errors() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await read_request(reader)
        if b'"big"' in data:
            writer.write(ok(b"x" * 5000))
        else:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(
            request(pool, b'"big"'), first_byte_timeout_s=2, total_timeout_s=5
        )
        with pytest.raises(UpstreamProtocolError, match="exceeds"):
            await response.read(1000)
        with pytest.raises(UpstreamProtocolError):
            await pool.request(request(pool, b'"junk"'), first_byte_timeout_s=2, total_timeout_s=5)

    asyncio.run(with_server(handler, body))


def test_abort_closes_the_upstream_connection() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        # Upstream notices the client left when a read returns EOF.
        assert await reader.read(1) == b""
        closed.set()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        response.abort()
        await asyncio.wait_for(closed.wait(), 2)

    asyncio.run(with_server(handler, body))


def test_a_closed_pool_keeps_no_connection_that_finishes_after_it_closed() -> None:
    """A reload that drops an endpoint closes its pool while requests are still in flight:
    their connections must close when they finish, not wait idle in a pool nobody uses."""
    closed_by_client = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(0.05)
        writer.write(ok(b'{"ok":true}'))
        await writer.drain()
        if await reader.read() == b"":  # EOF: the gateway closed its side
            closed_by_client.set()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        pool.close()  # while the exchange is still being read
        assert await response.read(1 << 20) == b'{"ok":true}'
        response.release()
        assert pool.idle_connections == 0
        await asyncio.wait_for(closed_by_client.wait(), 2)

    asyncio.run(with_server(handler, body))


def test_an_extra_answer_after_the_end_is_neither_relayed_nor_kept_for_the_next_request() -> None:
    """An upstream that sends two answers to one request (in one write, the second cut
    short) is out of sync: the first answer stays whole and alone, and the connection is
    dropped, so no byte of the second reaches this request's body or the next request."""
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first = connections == 1
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            extra = ok(b'{"injected":true}')[:-5] if first else b""
            writer.write(ok(b'{"ok":1}') + extra)
            await writer.drain()
            first = False

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        assert response.status == 200
        assert await response.read(1 << 20) == b'{"ok":1}'
        response.release()
        assert pool.idle_connections == 0
        again = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        assert await again.read(1 << 20) == b'{"ok":1}'
        again.release()
        assert connections == 2

    asyncio.run(with_server(handler, body))


@pytest.mark.parametrize("together", [True, False])
def test_interim_answers_are_skipped_for_the_final_one(together: bool) -> None:
    """A 100 Continue or a proxy's 103 Early Hints before the answer is no answer, nor a
    second one: the final answer is the response, and the connection stays reusable."""
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            if together:
                writer.write(interim + ok(b'{"ok":1}'))
            else:
                writer.write(interim)
                await writer.drain()
                await asyncio.sleep(0.05)
                writer.write(ok(b'{"ok":1}'))
            await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        for _ in range(2):
            response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
            assert response.status == 200 and response.header(b"link") is None
            assert await response.read(1 << 20) == b'{"ok":1}'
            response.release()
            assert pool.idle_connections == 1

    asyncio.run(with_server(handler, body))


def test_the_retry_on_a_fresh_connection_gets_only_the_time_left() -> None:
    """A reused connection dropped 0.6 s into a request: the retry on a fresh one may take
    only the 0.4 s left of the request's 1 s, not 1 s more."""
    requests = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            await read_request(reader)
            requests += 1
            if requests == 1:
                writer.write(ok(b"{}"))  # kept alive
                continue
            await asyncio.sleep(0.6)
            if requests == 2:
                writer.close()  # the engine drops the request it was working on
                return
            writer.write(ok(b"{}"))

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=1, total_timeout_s=1)
        await response.read(1024)
        response.release()
        with pytest.raises(UpstreamTimeout):
            await pool.request(request(pool), first_byte_timeout_s=1, total_timeout_s=1)

    asyncio.run(with_server(handler, body))


def answering_on_reuse(
    second: bytes, *, close: bool
) -> tuple[
    Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], Callable[[], int]
]:
    """A server that answers a first request with a 200 kept alive and the next one on that
    connection with `second` (then closes, if `close`); and how many requests it read."""
    requests = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            requests += 1
            writer.write(ok(b"{}") if requests == 1 else second)
            await writer.drain()
            if requests > 1 and close:
                writer.close()
                return

    return handler, lambda: requests


async def refused_on_reuse(pool: ConnectionPool, requests: Callable[[], int]) -> None:
    """A first answer kept alive, then a second request on the same connection: that one
    is a protocol error, and it is not sent again (the server saw two requests)."""
    response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
    await response.read(1024)
    response.release()
    with pytest.raises(UpstreamProtocolError):
        await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
    await asyncio.sleep(0.05)
    assert requests() == 2


def test_a_switch_of_protocols_is_a_protocol_error_not_a_stale_connection() -> None:
    """A 101 to a request that asked for no upgrade: httptools stops with its own exception,
    which must not escape to the event loop as a fatal transport error (seen as a closed
    connection, so the request went out again on a fresh one)."""
    switch = b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: x\r\n\r\n"
    handler, requests = answering_on_reuse(switch, close=False)
    asyncio.run(with_server(handler, lambda pool: refused_on_reuse(pool, requests)))


def test_a_status_below_100_is_a_protocol_error_not_an_interim_answer() -> None:
    """Status codes run from 100 to 599: a 099 is no interim answer to skip, and its body
    must not open the body of the answer that follows it."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 099 Odd\r\ncontent-length: 5\r\n\r\nJUNK!" + ok(b'{"ok":1}'))
        await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        with pytest.raises(UpstreamProtocolError):
            response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
            await response.read(1024)
        assert pool.idle_connections == 0

    asyncio.run(with_server(handler, body))


@pytest.mark.parametrize(
    "answer", [b"HTTP/1.1 200 OK\r\ncontent-", b"HTTP/1.1 100 Continue\r\n\r\n"], ids=["cut", "1xx"]
)
def test_a_reused_connection_that_closes_after_answering_is_not_retried(answer: bytes) -> None:
    """Only a reused connection that closes before any byte of the answer can be a stale
    one (the server's keep-alive expiry): once the engine has started to answer, it had
    the request, and sending it again would run it twice on that engine."""
    handler, requests = answering_on_reuse(answer, close=True)
    asyncio.run(with_server(handler, lambda pool: refused_on_reuse(pool, requests)))


def test_trailer_fields_do_not_join_the_headers() -> None:
    """A chunked answer's trailer section comes after the body: its fields are not header
    fields (RFC 9110, 6.5.1), and a `content-type` there must not become the answer's."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\ncontent-type: text/html\r\nx-trailer: 1\r\n\r\n"
        )
        await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        assert await response.read(1024) == b"{}"
        assert response.headers == [(b"transfer-encoding", b"chunked")]
        response.release()
        assert pool.idle_connections == 1

    asyncio.run(with_server(handler, body))


def test_an_http_1_0_answer_with_transfer_encoding_closes_its_connection() -> None:
    """HTTP/1.0 has no Transfer-Encoding: such an answer's framing is faulty, and its
    connection must close once it is read (RFC 9112, 6.1), keep-alive or not."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\n\r\n"
        )
        await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        response = await pool.request(request(pool), first_byte_timeout_s=2, total_timeout_s=5)
        assert await response.read(1024) == b"{}"
        response.release()
        assert pool.idle_connections == 0

    asyncio.run(with_server(handler, body))


def test_an_endless_head_is_a_protocol_error() -> None:
    """A head that never ends (one header line growing without end) is refused once past
    the bound, not held until the first-byte deadline: httptools keeps all of it, joined
    piece by piece, in memory."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-endless: ")
        with contextlib.suppress(ConnectionError):
            for _ in range(1000):  # 64 MiB at most
                writer.write(b"a" * 65536)
                await writer.drain()

    async def body(pool: ConnectionPool) -> None:
        with pytest.raises(UpstreamProtocolError, match="head"):
            await pool.request(request(pool), first_byte_timeout_s=5, total_timeout_s=5)

    asyncio.run(with_server(handler, body))


@pytest.mark.parametrize("connect_s", [0.6, 2.0])
def test_the_connect_spends_the_requests_deadline(connect_s: float) -> None:
    """A connect that takes 0.6 s (a SYN retransmitted) leaves the exchange 0.4 s of a 1 s
    deadline, not 1 s more; one slower than the deadline ends at the deadline, not at
    connect_timeout_s."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)  # never answers in time

    async def body(pool: ConnectionPool) -> None:
        pool.connect_timeout_s = 3.0
        loop = asyncio.get_running_loop()
        connect = loop.create_connection

        async def slow_connect(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(connect_s)
            return await connect(*args, **kwargs)

        loop.create_connection = slow_connect  # type: ignore[method-assign]
        began = loop.time()
        with pytest.raises(UpstreamTimeout) as caught:
            await pool.request(request(pool), first_byte_timeout_s=1, total_timeout_s=1)
        assert loop.time() - began < 1.2
        assert caught.value.total

    asyncio.run(with_server(handler, body))
