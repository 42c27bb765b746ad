"""A request head past MAX_HEAD_BYTES is refused before it is kept whole in memory, and one
that takes longer than HEAD_TIMEOUT_S to arrive is cut off."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest

from gateway import server_protocol
from gateway.config import Settings, parse_settings
from gateway.server_protocol import MAX_HEAD_BYTES
from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, free_port


def _settings() -> Settings:
    # Nothing listens at the tiers: a GET /health never reaches them.
    tiers = [
        {"name": p, "precision": p, "endpoints": [f"http://127.0.0.1:{free_port()}/v1"]}
        for p in ("nvfp4", "bf16")
    ]
    return parse_settings(
        {
            "model": MODEL,
            "tiers": tiers,
            "tenants": [{"name": "default", "api_keys": [API_KEY]}],
            "resilience": {"health_interval_s": 60},
        }
    )


def _status_after_header(gw: GatewayThread, value_bytes: int) -> bytes:
    """The status line the gateway answers a GET /health whose one header is this long."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-pad: "
        # Refused mid-head, the rest cannot be sent: the answer is already waiting.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + b"a" * value_bytes + b"\r\n\r\n")
        return sock.recv(4096).split(b"\r\n", 1)[0]


def test_an_endless_header_is_refused_and_a_long_one_is_not() -> None:
    with GatewayThread(_settings()) as gw:
        assert _status_after_header(gw, 64 * 1024) == b"HTTP/1.1 200 OK"
        assert _status_after_header(gw, 4 * MAX_HEAD_BYTES) == b"HTTP/1.1 400 Bad Request"


def test_a_head_that_trickles_in_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slowloris on the head: a connection that sends part of a request line and waits is
    closed once HEAD_TIMEOUT_S (shortened here) has passed, the sweep's half more at most;
    one that sends a whole request in time is served."""
    monkeypatch.setattr(server_protocol, "HEAD_TIMEOUT_S", 0.5)
    with GatewayThread(_settings()) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
            started = time.monotonic()
            assert sock.recv(4096) == b""  # closed, nothing answered
            assert 0.4 < time.monotonic() - started < 5.0
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert _health_answer(sock).startswith(b"HTTP/1.1 200 OK")
            time.sleep(1.2)  # past the deadline, kept alive: the next head gets its own
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert _health_answer(sock).startswith(b"HTTP/1.1 200 OK")


def _health_answer(sock: socket.socket) -> bytes:
    """One whole /health answer: its head and body may come in separate reads."""
    answer = b""
    while not answer.endswith(b'{"status":"ok"}'):
        part = sock.recv(4096)
        assert part, answer  # closed before the answer was whole
        answer += part
    return answer


def test_a_kept_alive_connections_next_head_is_counted_from_its_first_read() -> None:
    """Past the first request, the bound applies to the next head from its first byte."""
    with (
        GatewayThread(_settings()) as gw,
        socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock,
    ):
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _health_answer(sock).startswith(b"HTTP/1.1 200 OK")
        big = b"GET /health HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (MAX_HEAD_BYTES + 1)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(big + b"\r\n\r\n")
        assert sock.recv(4096).split(b"\r\n", 1)[0] == b"HTTP/1.1 400 Bad Request"


def _answer_to(gw: GatewayThread, request: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """Status line, headers and body of the gateway's answer to these raw bytes."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while part := sock.recv(65536):
                answer += part
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines)
    return status, headers, body


@pytest.mark.parametrize(
    ("request_bytes", "reason"),
    [
        (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-a: a\x00b\r\n\r\n", "header"),
        (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n"
            b"content-length: 2\r\n\r\n{}",
            "Duplicate Content-Length",
        ),
        (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
            b"\r\nzz\r\n{}\r\n0\r\n\r\n",
            "chunk size",
        ),
        (
            b"GET /health HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (2 * MAX_HEAD_BYTES),
            "too large",
        ),
        # uvicorn's URL callback refuses it: "User callback error" named nothing.
        (b"CONNECT x:443 HTTP/1.1\r\nhost: x\r\n\r\n", "invalid url b'x:443'"),
        # RFC 9112 3.2: an HTTP/1.1 server MUST refuse a request without one Host header.
        (b"GET /health HTTP/1.1\r\n\r\n", "exactly one Host header, not 0"),
        (b"GET /health HTTP/1.1\r\nhost: a\r\nHost: b\r\n\r\n", "one Host header, not 2"),
    ],
    ids=[
        "nul-in-header",
        "duplicate-content-length",
        "bad-chunk-size",
        "endless-head",
        "connect-target",
        "no-host",
        "two-hosts",
    ],
)
def test_an_unparsable_request_gets_an_openai_shaped_400_naming_the_reason(
    request_bytes: bytes, reason: str
) -> None:
    """What httptools refuses never reaches the app; its 400 still comes in OpenAI's shape
    (not uvicorn's plain "Invalid HTTP request received."), saying what was wrong."""
    with GatewayThread(_settings()) as gw:
        status, headers, body = _answer_to(gw, request_bytes)
    assert status == b"HTTP/1.1 400 Bad Request"
    assert headers[b"content-type"] == b"application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and reason in error["message"]


def _chunked_chat(body: bytes, trailers: bytes) -> bytes:
    """A chat request whose body comes as one chunk, then the trailer section given."""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {API_KEY}\r\n"
        "transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    ).encode()
    return head + b"%x\r\n" % len(body) + body + b"\r\n0\r\n" + trailers + b"\r\n"


def test_an_endless_trailer_section_is_refused_and_a_large_chunk_is_not(ladder: Ladder) -> None:
    """The trailers after a chunked body's last chunk are held as headers: past
    MAX_HEAD_BYTES they are refused as a head is, not kept until the body's deadline."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    endless = b"x-pad: " + b"a" * 1000 + b"\r\n"
    with GatewayThread(ladder.settings()) as gw:
        request = _chunked_chat(body.encode(), endless * (2 * MAX_HEAD_BYTES // len(endless)))
        status, headers, answer = _answer_to(gw, request)
        assert status == b"HTTP/1.1 400 Bad Request" and headers[b"connection"] == b"close"
        assert "trailer section is too large" in json.loads(answer)["error"]["message"]
        # A chunk larger than the bound, read over many reads, and a short trailer: served.
        padded = body.encode() + b" " * (2 * MAX_HEAD_BYTES)
        status, _, answer = _answer_to(gw, _chunked_chat(padded, b"x-end: 1\r\n"))
        assert status == b"HTTP/1.1 200 OK" and b'"chat.completion"' in answer


def test_an_http_1_0_request_needs_no_host_header() -> None:
    with GatewayThread(_settings()) as gw:
        status, _, body = _answer_to(gw, b"GET /health HTTP/1.0\r\n\r\n")
    assert status == b"HTTP/1.1 200 OK" and body == b'{"status":"ok"}'


def test_an_unparsable_request_after_one_being_served_waits_for_its_answer() -> None:
    """Pipelined requests followed by bytes httptools cannot parse: the requests before them
    are answered in order, then the 400 closes the connection. Written at once, the 400
    closed the connection first and the requests before it were lost."""
    health = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    with GatewayThread(_settings()) as gw:
        status, _, body = _answer_to(gw, health + health + b"garbage\r\n\r\n")
    assert status == b"HTTP/1.1 200 OK"
    answers = (status + b"\r\n" + body).split(b"HTTP/1.1 ")
    assert [answer.split(b"\r\n", 1)[0] for answer in answers[1:]] == [
        b"200 OK",
        b"200 OK",
        b"400 Bad Request",
    ]
    assert b"Invalid method encountered" in answers[-1]


def test_the_rest_of_a_body_answered_early_cannot_hold_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request refused before its body was read (a 401 here) keeps its connection while
    the rest of the body comes, within HEAD_TIMEOUT_S (shortened here): a client trickling
    it held the connection for good, each byte stopping uvicorn's keep-alive timer."""
    monkeypatch.setattr(server_protocol, "HEAD_TIMEOUT_S", 0.5)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n"
    with GatewayThread(_settings()) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(head + b"{")
            assert _refusal(sock).startswith(b"HTTP/1.1 401 ")
            started = time.monotonic()
            sock.settimeout(0.1)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                while time.monotonic() - started < 5 and not _closed(sock):
                    sock.sendall(b" ")  # a byte every 0.1 s, never the whole body
            assert time.monotonic() - started < 2.0
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(head + b" " * 1000)  # the whole body at once: kept alive
            assert _refusal(sock).startswith(b"HTTP/1.1 401 ")
            time.sleep(1.2)
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert _health_answer(sock).startswith(b"HTTP/1.1 200 OK")


def _closed(sock: socket.socket) -> bool:
    """Whether the gateway has closed `sock`, waiting for that up to its timeout."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except TimeoutError:
        return False  # open, nothing to read


def _refusal(sock: socket.socket) -> bytes:
    """One whole OpenAI-shaped error answer: its head and body may come in separate reads."""
    answer = b""
    while not answer.endswith(b"}}"):
        part = sock.recv(4096)
        assert part, answer
        answer += part
    return answer


def test_a_slow_head_after_a_request_being_served_does_not_lose_its_answer(
    monkeypatch: pytest.MonkeyPatch, ladder: Ladder
) -> None:
    """A client that pipelines part of its next head while its request waits on the engine
    gets that request's answer: the head deadline closed the connection under it."""
    monkeypatch.setattr(server_protocol, "HEAD_TIMEOUT_S", 0.5)
    for sim in ladder.sims:
        sim.faults(added_latency_s=2.0)
    try:
        with (
            GatewayThread(ladder.settings()) as gw,
            socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock,
        ):
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                f"authorization: Bearer {API_KEY}\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body.encode() + b"GET /health HT")
            answer = b""
            while part := sock.recv(65536):  # then the unfinished head is cut off
                answer += part
            assert answer.startswith(b"HTTP/1.1 200 ") and b'"chat.completion"' in answer
    finally:
        for sim in ladder.sims:
            sim.faults(added_latency_s=0.0)


def test_a_body_of_many_chunks_whose_size_lines_come_alone_is_served(ladder: Ladder) -> None:
    """Each read after a chunk's size line is counted toward the trailer bound until its
    data comes: the count starts again at each chunk, so a large body sent a size line at
    a time (as a client writing each chunk's parts apart does) is no trailer past the bound."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    padded = body.encode() + b" " * (3 * MAX_HEAD_BYTES)
    step = 1 << 17
    with (
        GatewayThread(ladder.settings()) as gw,
        socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock,
    ):
        head = _chunked_chat(b"", b"").split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
        sock.sendall(head)
        for start in range(0, len(padded), step):
            chunk = padded[start : start + step]
            sock.sendall(b"%x\r\n" % len(chunk))
            time.sleep(0.01)  # its own read: the data's read is counted whole
            sock.sendall(chunk + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while part := sock.recv(65536):
                answer += part
    assert answer.startswith(b"HTTP/1.1 200 OK") and b'"chat.completion"' in answer
