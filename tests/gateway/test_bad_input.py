"""Client mistakes get an OpenAI-shaped 4xx, never a 5xx, and never reach a tier."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, send


def post(
    gw: GatewayThread,
    body: bytes,
    headers: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
) -> tuple[int, Any]:
    # `headers` replaces the default authorization (None: send the valid key).
    key = API_KEY if headers is None else None
    reply = send("POST", f"{gw.url}{path}", body, key=key, headers=headers, timeout=10)
    return reply.status, reply.json()


def assert_openai_error(status: int, body: Any, expected_status: int) -> dict[str, Any]:
    assert status == expected_status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"", None),
        (json.dumps({"model": MODEL}).encode(), "messages"),
        (json.dumps({"model": MODEL, "messages": []}).encode(), "messages"),
        (json.dumps({"model": MODEL, "messages": "hello"}).encode(), "messages"),
        (
            json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).encode(),
            "messages.0.role",
        ),
        (json.dumps({**CHAT, "max_tokens": "ten"}).encode(), "max_tokens"),
        (json.dumps({**CHAT, "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({**CHAT, "temperature": 9}).encode(), "temperature"),
        (json.dumps({**CHAT, "stream": "yes"}).encode(), "stream"),
        (json.dumps({"messages": CHAT["messages"]}).encode(), "model"),
    ],
)
def test_malformed_bodies_are_400(
    gw: GatewayThread, ladder: Ladder, body: bytes, param: str | None
) -> None:
    before = [sim.stats()["requests"] for sim in ladder.sims]
    status, response = post(gw, body)
    error = assert_openai_error(status, response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert [sim.stats()["requests"] for sim in ladder.sims] == before


def test_body_over_limit_is_413(ladder: Ladder) -> None:
    settings = ladder.settings(limits={"max_body_bytes": 4096})
    with GatewayThread(settings) as gw:
        body = json.dumps(
            {**CHAT, "messages": [{"role": "user", "content": "x" * 10_000}]}
        ).encode()
        status, response = post(gw, body)
        assert_openai_error(status, response, 413)


def test_too_many_messages_is_400(ladder: Ladder) -> None:
    with GatewayThread(ladder.settings(limits={"max_messages": 2})) as gw:
        messages = [{"role": "user", "content": "x"}] * 3
        status, response = post(gw, json.dumps({**CHAT, "messages": messages}).encode())
        error = assert_openai_error(status, response, 400)
        assert error["param"] == "messages" and "limit is 2" in error["message"]
        assert post(gw, json.dumps({**CHAT, "messages": messages[:2]}).encode())[0] == 200


def test_json_nesting_limit(gw: GatewayThread) -> None:
    nested: Any = "x"
    for _ in range(100):
        nested = [nested]
    status, response = post(gw, json.dumps({**CHAT, "metadata": nested}).encode())
    assert_openai_error(status, response, 400)


@pytest.mark.parametrize(
    ("model", "code"),
    [
        ("gpt-4", "model_not_found"),
        (f"{MODEL}@fp2", "tier_not_found"),
        (f"{MODEL}@", "model_not_found"),
    ],
)
def test_unknown_model_or_tier_is_404(gw: GatewayThread, model: str, code: str) -> None:
    status, response = post(gw, json.dumps({**CHAT, "model": model}).encode())
    error = assert_openai_error(status, response, 404)
    assert error["code"] == code and error["param"] == "model"


def test_unknown_tier_header_is_404(gw: GatewayThread) -> None:
    headers = {"authorization": f"Bearer {API_KEY}", "x-tiergate-tier": "int2"}
    status, response = post(gw, json.dumps(CHAT).encode(), headers)
    assert_openai_error(status, response, 404)
    # A pin is matched against tier names, never echoed into a response header.
    injected = {"authorization": f"Bearer {API_KEY}", "x-tiergate-tier": "int2 x-evil: 1"}
    reply = send("POST", f"{gw.url}/v1/chat/completions", CHAT, key=None, headers=injected)
    assert reply.status == 404
    assert not any("int2" in value or "evil" in value for value in reply.headers.values())


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer sk-wrong"},
        {"authorization": "Basic abc"},
        {"authorization": "Bearer "},
    ],
)
def test_missing_or_wrong_key_is_401(gw: GatewayThread, headers: dict[str, str]) -> None:
    status, response = post(gw, json.dumps(CHAT).encode(), headers)
    error = assert_openai_error(status, response, 401)
    assert error["type"] == "authentication_error"
    labels = {"tenant": "_unauthenticated", "tier": "_none", "endpoint": "chat", "status": "401"}
    assert gw.metric_at_least("tiergate_requests_total", labels, 1) >= 1


def test_unknown_route_and_method(gw: GatewayThread) -> None:
    status, response = post(gw, b"{}", path="/v1/embeddings")
    assert_openai_error(status, response, 404)
    request = urllib.request.Request(f"{gw.url}/v1/models", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 405
    assert set(json.loads(caught.value.read())["error"]) == {"message", "type", "param", "code"}


def test_wrong_method_on_a_generation_path_is_405_with_allow(gw: GatewayThread) -> None:
    reply = send("GET", f"{gw.url}/v1/chat/completions", None, key=API_KEY, timeout=10)
    assert_openai_error(reply.status, reply.json(), 405)
    assert reply.headers["allow"] == "POST"


def test_oversized_body_message_states_the_limit_not_a_size(ladder: Ladder) -> None:
    """The client reads its 413 every time: the rest of the body is read and dropped before
    the connection closes (closing with unread data sent a reset, and 27 of 30 clients
    sending 4 MB got "connection reset by peer" instead of the 413)."""
    settings = ladder.settings(limits={"max_body_bytes": 4096})
    with GatewayThread(settings) as gw:
        body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 4 * 10**6}]})
        for _ in range(10):
            status, response = post(gw, body.encode())
            error = assert_openai_error(status, response, 413)
            assert error["message"] == "Request body is larger than the limit of 4096 bytes."


def test_non_utf8_body_is_named_as_such(gw: GatewayThread) -> None:
    status, response = post(gw, b'{"model": "\xff\xfe"}')
    error = assert_openai_error(status, response, 400)
    assert error["message"] == "Request body is not valid UTF-8 text."


def test_a_header_pin_error_names_no_body_parameter(gw: GatewayThread) -> None:
    headers = {"authorization": f"Bearer {API_KEY}", "x-tiergate-tier": "int2"}
    status, response = post(gw, json.dumps(CHAT).encode(), headers)
    error = assert_openai_error(status, response, 404)
    assert error["code"] == "tier_not_found" and error["param"] is None


def test_contradicting_pins_are_a_400_not_a_404(gw: GatewayThread) -> None:
    # Both tiers exist: the request contradicts itself, nothing it asks for is missing.
    headers = {"authorization": f"Bearer {API_KEY}", "x-tiergate-tier": "nvfp4"}
    body = json.dumps({**CHAT, "model": f"{MODEL}@bf16"}).encode()
    error = assert_openai_error(*post(gw, body, headers), 400)
    assert error["code"] == "conflicting_pins" and error["param"] == "model"


def test_two_header_pins_naming_different_tiers_are_a_400(
    gw: GatewayThread, ladder: Ladder
) -> None:
    """The last of two x-tiergate-tier headers used to win silently."""
    before = sum(sim.stats()["requests"] for sim in ladder.sims)
    connection = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        body = json.dumps(CHAT).encode()
        connection.putrequest("POST", "/v1/chat/completions")
        connection.putheader("authorization", f"Bearer {API_KEY}")
        for tier in ("nvfp4", "bf16"):
            connection.putheader("x-tiergate-tier", tier)
        connection.putheader("content-length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        error = assert_openai_error(response.status, json.loads(response.read()), 400)
    finally:
        connection.close()
    assert error["code"] == "conflicting_pins" and "'nvfp4' and 'bf16'" in error["message"]
    assert sum(sim.stats()["requests"] for sim in ladder.sims) == before


def test_a_trailing_slash_is_a_404_not_a_redirect_built_from_the_host_header(
    gw: GatewayThread,
) -> None:
    for method, path in (("POST", "/v1/chat/completions/"), ("GET", "/ready/")):
        reply = send(
            method,
            f"{gw.url}{path}",
            CHAT if method == "POST" else None,
            headers={"host": "evil.example"},
        )
        error = assert_openai_error(reply.status, reply.json(), 404)
        assert path in error["message"] and "location" not in reply.headers


def test_a_body_led_by_a_byte_order_mark_is_served(gw: GatewayThread, ladder: Ladder) -> None:
    before = sum(sim.stats()["requests"] for sim in ladder.sims)
    status, response = post(gw, b"\xef\xbb\xbf" + json.dumps(CHAT).encode())
    assert status == 200 and response["choices"][0]["message"]["content"]
    assert sum(sim.stats()["requests"] for sim in ladder.sims) == before + 1
    # A mark in front of a broken body still names what is wrong with the body.
    error = assert_openai_error(*post(gw, b"\xef\xbb\xbf{not json"), 400)
    assert error["message"].startswith("Request body is not valid JSON")


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("gzip", lambda body: body), ("br", lambda body: body)],
)
def test_a_compressed_body_is_a_415_not_a_misleading_400_or_served(
    gw: GatewayThread, ladder: Ladder, encoding: str, compress: Any
) -> None:
    """The gateway reads bodies as plain JSON: a gzip body was answered "not valid UTF-8",
    and a plain one labelled gzip was served as if the header were not there."""
    before = sum(sim.stats()["requests"] for sim in ladder.sims)
    headers = {"authorization": f"Bearer {API_KEY}", "content-encoding": encoding}
    status, response = post(gw, compress(json.dumps(CHAT).encode()), headers)
    error = assert_openai_error(status, response, 415)
    assert f"Content-Encoding '{encoding}'" in error["message"]
    assert sum(sim.stats()["requests"] for sim in ladder.sims) == before
    identity = {"authorization": f"Bearer {API_KEY}", "content-encoding": "identity"}
    assert post(gw, json.dumps(CHAT).encode(), identity)[0] == 200


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_json_body_is_read_as_json_whatever_its_content_type(
    gw: GatewayThread, content_type: str | None
) -> None:
    """`curl -d` without `-H` sends a form content type: the body is still read as JSON."""
    connection = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        connection.putrequest("POST", "/v1/chat/completions")
        body = json.dumps(CHAT).encode()
        connection.putheader("authorization", f"Bearer {API_KEY}")
        connection.putheader("content-length", str(len(body)))
        if content_type is not None:
            connection.putheader("content-type", content_type)
        connection.endheaders(body)
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["choices"]
    finally:
        connection.close()


def test_a_transfer_coding_other_than_chunked_is_a_400_not_read_as_json(
    gw: GatewayThread, ladder: Ladder
) -> None:
    """The HTTP parser undoes `chunked` only: a `gzip, chunked` body was read as if it were
    plain (served when it was, "not valid UTF-8" when it was gzip-coded)."""
    body = json.dumps(CHAT).encode()

    def chunked(coding: str) -> bytes:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {API_KEY}"
            f"\r\ncontent-type: application/json\r\ntransfer-encoding: {coding}\r\n"
            "connection: close\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
            sock.sendall(head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            answer = b""
            while part := sock.recv(65536):
                answer += part
        return answer

    before = sum(sim.stats()["requests"] for sim in ladder.sims)
    head, _, payload = chunked("gzip, chunked").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    error = json.loads(payload)["error"]
    assert error["code"] == "unsupported_transfer_encoding" and "gzip" in error["message"]
    assert sum(sim.stats()["requests"] for sim in ladder.sims) == before
    assert chunked("chunked").startswith(b"HTTP/1.1 200 ")


def test_a_body_lost_to_an_h2c_upgrade_is_named_and_the_connection_closed(
    gw: GatewayThread, ladder: Ladder
) -> None:
    """`curl --http2` on http:// asks for `Upgrade: h2c`; httptools then ends the request at
    its headers and its body is dropped. It was answered "Request body is empty" and the
    connection kept, the body's bytes left to be read as the next request."""
    body = json.dumps(CHAT).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        f"authorization: Bearer {API_KEY}\r\ncontent-type: application/json\r\n"
        "connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQ\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    before = sum(sim.stats()["requests"] for sim in ladder.sims)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while part := sock.recv(65536):  # the gateway closes the connection
            answer += part
    head_part, _, payload = answer.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head_part.lower()
    error = json.loads(payload)["error"]
    assert error["code"] == "upgrade_not_supported" and "h2c" in error["message"]
    assert sum(sim.stats()["requests"] for sim in ladder.sims) == before
    # Without the upgrade the same request is served.
    assert post(gw, body)[0] == 200


def _with_two_keys(gw: GatewayThread, method: str, path: str, keys: list[str]) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    try:
        body = json.dumps(CHAT).encode() if method == "POST" else None
        connection.putrequest(method, path)
        for key in keys:
            connection.putheader("authorization", f"Bearer {key}")
        if body is not None:
            connection.putheader("content-length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("keys", [[API_KEY, "sk-wrong"], ["sk-wrong", API_KEY], [API_KEY] * 2])
@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/chat/completions"), ("GET", "/v1/models")]
)
def test_several_authorization_headers_are_refused_on_every_route(
    gw: GatewayThread, keys: list[str], method: str, path: str
) -> None:
    # Servers disagree on which of several headers counts (first or last), so none does.
    error = assert_openai_error(*_with_two_keys(gw, method, path, keys), 401)
    assert error["code"] == "several_authorization_headers"


def test_an_engine_refusal_reaches_the_client_in_the_gateways_error_shape(
    gw: GatewayThread,
) -> None:
    # max_tokens beyond the context window: the engine (the simulator, as vLLM) refuses it
    # with `"type": "BadRequestError", "code": 400`; the client sees the gateway's convention.
    status, response = post(gw, json.dumps({**CHAT, "max_tokens": 10**7}).encode())
    error = assert_openai_error(status, response, 400)
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert "max_tokens" in error["message"] and error["param"] == "max_tokens"


def test_a_gateway_defect_is_an_openai_shaped_500_and_counted(ladder: Ladder) -> None:
    """Not a client's mistake: a bug inside the gateway (here a policy that raises). The
    client still gets OpenAI's error shape, and the metrics count a 500, not status 0."""

    class BrokenPolicy:
        def decide(self, request: Any, kind: Any, tenant: Any) -> Any:
            raise RuntimeError("a defect")

    with GatewayThread(ladder.settings(), policy_factory=lambda _s: BrokenPolicy()) as gw:
        reply = send(
            "POST",
            f"{gw.url}/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert reply.status == 500
        assert reply.json()["error"]["code"] == "internal_error"
        labels = {"tenant": "default", "tier": "_none", "endpoint": "chat", "status": "500"}
        assert gw.settled_metric("tiergate_requests_total", labels, 1) == 1


@pytest.mark.parametrize("sent", [b"", b'{"mo'])  # headers alone, or 4 bytes of 100
def test_a_body_that_trickles_in_gets_a_408_not_a_connection_held_for_good(
    ladder: Ladder, sent: bytes
) -> None:

    settings = ladder.settings(limits={"body_timeout_s": 1.0})
    with GatewayThread(settings) as gw, socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.settimeout(10)
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            f"authorization: Bearer {API_KEY}\r\ncontent-length: 100\r\n\r\n"
        )
        sock.sendall(head.encode() + sent)  # then nothing
        started = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        assert time.monotonic() - started < 5
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.split()[1] == b"408"
        error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "request_timeout" and "1 s" in error["message"]
        # The connection ends with the 408: kept alive, the rest of the body was still
        # awaited, so a client trickling it held the connection past every timer.
        assert b"connection: close" in rest.partition(b"\r\n\r\n")[0].lower()
        assert sock.recv(65536) == b""


def _head_with_length(length: int, extra: str = "") -> bytes:
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        f"authorization: Bearer {API_KEY}\r\ncontent-length: {length}\r\n{extra}\r\n"
    ).encode()


def _one_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """The head and body of the next answer on `sock` (its body is JSON with a length)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        part = sock.recv(65536)
        assert part, answer
        answer += part
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


@contextlib.contextmanager
def _raw_connection(ladder: Ladder) -> Iterator[tuple[GatewayThread, socket.socket]]:
    """A gateway on `ladder` and one raw socket connected to it."""
    with (
        GatewayThread(ladder.settings()) as gw,
        socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock,
    ):
        yield gw, sock


def _asked_for_body(sock: socket.socket, length: int, extra: str) -> None:
    """Sends a chat head of `length` with `extra` headers (an Expect among them) and checks
    that the gateway asks for the body."""
    sock.sendall(_head_with_length(length, extra))
    assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"


def test_a_declared_length_over_the_limit_is_a_413_instead_of_100_continue(
    ladder: Ladder,
) -> None:
    """A client waiting on `Expect: 100-continue` (curl's way past 1 KiB) with a
    Content-Length past the limit gets the 413 at once and the connection closes; it was
    told "100 Continue" and asked to upload the whole body first."""
    settings = ladder.settings(limits={"max_body_bytes": 4096})
    with GatewayThread(settings) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
            sock.sendall(_head_with_length(10**9, "expect: 100-continue\r\n"))
            head, body = _one_answer(sock)
            assert head.startswith(b"HTTP/1.1 413 ") and b"connection: close" in head
            assert json.loads(body)["error"]["code"] == "payload_too_large"
            assert sock.recv(65536) == b""  # closed: no body will be read as a request
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
            # Within the limit, the client is asked for its body and served.
            chat = json.dumps(CHAT).encode()
            _asked_for_body(sock, len(chat), "expect: 100-continue\r\n")
            sock.sendall(chat)
            assert _one_answer(sock)[0].startswith(b"HTTP/1.1 200 ")


def test_a_refusal_before_an_expected_body_is_sent_closes_the_connection(
    ladder: Ladder,
) -> None:
    """A request waiting on `100 Continue` that is refused first (a 401) is answered with
    `connection: close` and the connection closes: kept alive, the client's next request
    was read as the body it never sent. One whose body came is kept alive."""
    wrong_key = _head_with_length(30, "expect: 100-continue\r\n").replace(
        API_KEY.encode(), b"sk-wrong"
    )
    health = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    with GatewayThread(ladder.settings()) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
            sock.sendall(wrong_key)
            head, _ = _one_answer(sock)
            assert head.startswith(b"HTTP/1.1 401 ") and b"connection: close" in head
            # Kept alive, it was taken for the unsent body; closed, it may meet a reset.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(health)
                assert sock.recv(65536) == b""
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
            chat = json.dumps(CHAT).encode()
            _asked_for_body(sock, len(chat), "expect: 100-continue\r\n")
            sock.sendall(chat)
            head, _ = _one_answer(sock)
            assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in head
            sock.sendall(health)
            assert _one_answer(sock)[0].startswith(b"HTTP/1.1 200 ")


def test_a_body_sent_after_100_continue_during_a_shutdown_does_not_keep_it_alive(
    ladder: Ladder,
) -> None:
    """The graceful shutdown ends the connection after the request in flight; the body of
    one that waited on `100 Continue` coming after it began did not make it kept alive."""
    chat = json.dumps(CHAT).encode()
    with _raw_connection(ladder) as (gw, sock):
        _asked_for_body(sock, len(chat), "expect: 100-continue\r\n")
        gw.server.should_exit = True
        deadline = time.monotonic() + 5
        while any(server.is_serving() for server in gw.server.servers):
            assert time.monotonic() < deadline
            time.sleep(0.01)  # the listeners close, and each connection is told at once
        sock.sendall(chat)
        head, _ = _one_answer(sock)
        assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head


def test_expect_100_continue_is_read_whatever_its_case(ladder: Ladder) -> None:
    """Header values compare case-insensitively (RFC 9110 10.1.1): a client that sends
    `Expect: 100-Continue` waits for `100 Continue` (curl's wait is a second) as one in
    lower case does, and is asked for its body at once."""
    chat = json.dumps(CHAT).encode()
    with _raw_connection(ladder) as (_, sock):
        _asked_for_body(sock, len(chat), "Expect: 100-Continue\r\n")
        sock.sendall(chat)
        assert _one_answer(sock)[0].startswith(b"HTTP/1.1 200 ")


def test_an_expected_empty_body_keeps_the_connection_alive(ladder: Ladder) -> None:
    """A request waiting on `100 Continue` whose body is empty has nothing left to send:
    its answer keeps the connection alive as the request asked."""
    health = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    with _raw_connection(ladder) as (_, sock):
        sock.sendall(_head_with_length(0, "expect: 100-continue\r\n"))
        answer = b""
        while not answer.endswith(b"}}"):  # a 400's JSON error, after any `100 Continue`
            part = sock.recv(65536)
            assert part, answer
            answer += part
        head = answer.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n").partition(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" not in head
        sock.sendall(health)
        assert _one_answer(sock)[0].startswith(b"HTTP/1.1 200 ")


def test_an_expected_body_that_comes_keeps_the_connection_as_the_request_asked(
    ladder: Ladder,
) -> None:
    """The keep-alive held back while a request waits on `100 Continue` comes back when
    its body does: as the request asked, so one that asked to close is closed."""
    chat = json.dumps(CHAT).encode()
    with _raw_connection(ladder) as (_, sock):
        _asked_for_body(sock, len(chat), "expect: 100-continue\r\nconnection: close\r\n")
        sock.sendall(chat)
        head, _ = _one_answer(sock)
        assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head
        assert sock.recv(65536) == b""
