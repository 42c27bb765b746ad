"""What the relay records and returns for each way an answer ends: a whole JSON body (usage,
an engine's refusal), a stream the engine ends with an error event, an upstream failure after
the first byte, a client that leaves or stops reading."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from gateway.backends.h1client import (
    UpstreamConnectError,
    UpstreamFailure,
    UpstreamResponse,
    UpstreamTimeout,
)
from gateway.protocol import EndpointKind
from gateway.proxy import relay
from gateway.proxy.relay import Exchange, relay_body, relay_stream
from tests.gateway.proxy.exchanges import pinned_exchange, relayed_body

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'


class _Body:
    """A whole upstream answer: its status and headers (the body is passed apart)."""

    def __init__(self, status: int, content_type: bytes = b"application/json") -> None:
        self.status = status
        self.content_type = content_type

    def header(self, name: bytes) -> bytes | None:
        return self.content_type if name == b"content-type" else None


class _Stream:
    """Upstream reads, each bytes or a failure to raise; `on_read` runs before each."""

    def __init__(self, reads: list[bytes | UpstreamFailure], on_read: Any = None) -> None:
        self.reads = list(reads)
        self.on_read = on_read
        self.aborted = False

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        if self.on_read is not None:
            self.on_read(len(self.reads))
        if not self.reads:
            raise StopAsyncIteration
        read = self.reads.pop(0)
        if isinstance(read, UpstreamFailure):
            raise read
        return read

    def abort(self) -> None:
        self.aborted = True


def _run_body(status: int, data: bytes, exchange: Exchange | None = None) -> Any:
    if exchange is None:
        exchange, sent = pinned_exchange()
    else:
        sent = []
    response: UpstreamResponse = _Body(status)  # type: ignore[assignment]
    asyncio.run(relay_body(exchange, response, data))
    return exchange, sent


def _headers(sent: list[dict[str, Any]]) -> dict[bytes, bytes]:
    (start,) = [message for message in sent if message["type"] == "http.response.start"]
    return dict(start["headers"])


def test_a_json_answers_usage_is_recorded_as_prompt_and_completion_tokens() -> None:
    body = b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}'
    exchange, _ = _run_body(200, body)
    assert (exchange.record.prompt_tokens, exchange.record.completion_tokens) == (7, 3)


def test_an_engines_400_reaches_the_client_in_the_gateways_error_shape() -> None:
    vllm = b'{"object":"error","message":"bad top_k","type":"BadRequestError","code":400}'
    exchange, sent = _run_body(400, vllm)
    error = json.loads(relayed_body(sent))["error"]
    assert error["message"] == "bad top_k" and error["type"] == "invalid_request_error"
    assert exchange.record.prompt_tokens == 0


def test_a_captured_json_answer_is_the_body_the_client_got() -> None:
    exchange, sent = pinned_exchange()
    exchange.captured = []
    _run_body(200, b'{"choices":[]}', exchange)
    assert exchange.captured == [relayed_body(sent)]


def test_the_overhead_header_is_in_milliseconds_and_leaves_out_the_upstream_wait() -> None:
    exchange, sent = pinned_exchange()
    exchange.started = time.perf_counter() - 0.3
    exchange.waited = 0.25
    _run_body(200, b"{}", exchange)
    overhead_ms = float(_headers(sent)[b"x-tiergate-overhead-ms"])
    assert 50 <= overhead_ms < 1000
    assert exchange.record.overhead_s == pytest.approx(overhead_ms / 1000, abs=1e-3)


def _stream(
    reads: list[bytes | UpstreamFailure], stall_s: float = 60.0, **kwargs: Any
) -> tuple[bool, Exchange, list[dict[str, Any]], _Stream]:
    exchange, sent = pinned_exchange()
    stream = _Stream(reads, **kwargs)
    response: UpstreamResponse = stream  # type: ignore[assignment]
    failed = asyncio.run(relay_stream(exchange, response, stall_s=stall_s))
    return failed, exchange, sent, stream


@pytest.mark.parametrize(
    "error",
    [
        b'data: {"error":{"message":"engine died","code":500}}\n\n',  # chat, completions
        b'event: error\ndata: {"type":"error","message":"engine died"}\n\n',  # Responses
        # SSE's space after the colon is optional: without it the error passed for success.
        b'data:{"error":{"message":"engine died","code":500}}\n\n',
        b'event:error\ndata:{"type":"error","message":"engine died"}\n\n',
    ],
)
def test_an_engines_error_event_is_relayed_and_is_the_engines_failure(error: bytes) -> None:
    failed, exchange, sent, _ = _stream([CHUNK, error, b"data: [DONE]\n\n"])
    assert failed and exchange.record.error_after_first_byte
    assert b"engine died" in relayed_body(sent)


def test_a_stream_that_ends_well_is_no_failure() -> None:
    failed, exchange, _, _ = _stream([CHUNK + CHUNK, b"data: [DONE]\n\n"])
    assert not failed and not exchange.record.error_after_first_byte
    assert exchange.record.streamed_events == 3  # two in one read, then [DONE]


def test_a_streams_usage_is_read_however_its_json_is_spaced() -> None:
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}\n\n'
    _, exchange, _, _ = _stream([CHUNK, usage, b"data: [DONE]\n\n"])
    assert (exchange.record.prompt_tokens, exchange.record.completion_tokens) == (5, 2)


def test_the_first_token_time_is_the_first_output_not_a_keep_alive_nor_a_later_event() -> None:
    """A keep-alive, the first output 0.2 s later, more output 1 s after that (far enough
    that a loaded host's stall cannot make the later event's time pass for the first's)."""

    def pace(left: int) -> None:
        time.sleep({2: 0.2, 1: 1.0}.get(left, 0.0))

    exchange, _ = pinned_exchange()
    stream = _Stream([b": ping\n\n", CHUNK, CHUNK], on_read=pace)
    response: UpstreamResponse = stream  # type: ignore[assignment]

    async def scenario() -> None:
        exchange.started = time.perf_counter()
        await relay_stream(exchange, response, stall_s=60.0)

    asyncio.run(scenario())
    assert exchange.record.ttft_s is not None and 0.2 <= exchange.record.ttft_s < 1.2


def test_a_stream_the_upstream_drops_ends_with_an_error_event() -> None:
    failed, exchange, sent, _ = _stream([CHUNK, UpstreamConnectError("reset by 10.0.0.1")])
    assert failed and exchange.record.error_after_first_byte
    assert b"failed after the first byte" in relayed_body(sent)
    assert exchange.record.status != 499


def test_a_responses_stream_the_upstream_drops_ends_with_openais_error_event() -> None:
    """Responses events are typed and numbered: the gateway's error event is OpenAI's
    `error` event, numbered after the last event relayed (the chat shape had no type)."""
    exchange, sent = pinned_exchange()
    exchange.kind = "responses"
    delta = (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"delta":"Hi","sequence_number": 7}\n\n'
    )
    stream = _Stream([delta, UpstreamConnectError("reset by 10.0.0.1")])
    response: UpstreamResponse = stream  # type: ignore[assignment]
    assert asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    last = relayed_body(sent).split(b"\n\n")[-2]
    name, data = last.split(b"\n")
    assert name == b"event: error"
    event = json.loads(data.removeprefix(b"data: "))
    assert event["type"] == "error" and event["sequence_number"] == 8
    assert event["code"] == "upstream_failed" and event["param"] is None
    assert "failed after the first byte" in event["message"]


def test_a_responses_stream_dropped_before_any_numbered_event_numbers_its_error_0() -> None:
    exchange, sent = pinned_exchange()
    exchange.kind = "responses"
    stream = _Stream([b": ping\n\n", UpstreamConnectError("reset")])
    response: UpstreamResponse = stream  # type: ignore[assignment]
    asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    data = relayed_body(sent).rsplit(b"data: ", 1)[-1]
    assert json.loads(data)["sequence_number"] == 0


def test_a_responses_error_event_follows_the_last_numbered_event_not_a_comment() -> None:
    """A keep-alive comment relayed after the last numbered event (a proxy on the way may
    send one) numbers nothing: the error event still follows that event's number."""
    delta = (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"delta":"Hi","sequence_number":7}\n\n'
    )
    for batches, number in (
        ([delta, b": keep-alive\n\n"], 8),
        ([b": keep-alive\n\n" + delta.replace(b":7}", b":9}")], 10),  # a comment, then events
    ):
        exchange, sent = pinned_exchange()
        exchange.kind = "responses"
        stream = _Stream([*batches, UpstreamConnectError("reset")])
        response: UpstreamResponse = stream  # type: ignore[assignment]
        asyncio.run(relay_stream(exchange, response, stall_s=60.0))
        data = relayed_body(sent).rsplit(b"data: ", 1)[-1]
        assert json.loads(data)["sequence_number"] == number


def test_a_stream_cut_by_its_total_s_is_the_engines_fault_only_after_a_stall() -> None:
    """Cut by the request's own deadline while the engine was producing: not the engine's
    failure; silent for the stall time before the cut: it stalled."""
    deadline = UpstreamTimeout("total", total=True)
    failed, exchange, _, _ = _stream([CHUNK, deadline], stall_s=60.0)
    assert not failed and exchange.record.error_after_first_byte
    stalled, _, _, _ = _stream([CHUNK, UpstreamTimeout("total", total=True)], stall_s=0.0)
    assert stalled


def test_an_event_that_never_ends_is_cut_at_the_response_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay, "MAX_RESPONSE_BYTES", 100)
    endless = [b'data: {"choices":[{"delta":{"content":"' + b"x" * 60] + [b"x" * 60] * 20
    failed, exchange, sent, _ = _stream([CHUNK, *endless])
    assert failed and exchange.record.error_after_first_byte
    assert b"over 100 bytes" in relayed_body(sent)


def test_a_client_that_leaves_mid_stream_is_a_499_and_the_upstream_is_aborted() -> None:
    holder: dict[str, Exchange] = {}

    def leave_after_the_first_read(left: int) -> None:
        if left == 2:  # the first event was relayed: now the client goes
            holder["exchange"].channel.disconnected = True

    exchange, sent = pinned_exchange()
    holder["exchange"] = exchange
    stream = _Stream([CHUNK, CHUNK, b"data: [DONE]\n\n"], on_read=leave_after_the_first_read)
    response: UpstreamResponse = stream  # type: ignore[assignment]
    failed = asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    assert not failed and stream.aborted
    assert exchange.record.status == 499 and exchange.record.client_disconnected
    assert not exchange.record.error_after_first_byte
    assert relayed_body(sent).count(b"data:") == 2  # nothing after the departure


def test_an_upstream_failure_after_the_client_left_is_the_clients_departure() -> None:
    """The abort for a departed client fails the upstream read: that is no stream error."""
    holder: dict[str, Exchange] = {}

    def leave(left: int) -> None:
        holder["exchange"].channel.disconnected = True

    exchange, sent = pinned_exchange()
    holder["exchange"] = exchange
    stream = _Stream([UpstreamConnectError("aborted")], on_read=leave)
    response: UpstreamResponse = stream  # type: ignore[assignment]
    failed = asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    assert not failed and exchange.record.status == 499
    assert not exchange.record.error_after_first_byte
    assert b"failed after the first byte" not in relayed_body(sent)


def _unread_stream(total_s: float, read_after_s: float) -> tuple[bool, Exchange, _Stream]:
    """A stream whose client takes `read_after_s` to read the first event."""
    exchange, _ = pinned_exchange()
    slow = {"first": True}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and slow["first"]:
            slow["first"] = False
            await asyncio.sleep(read_after_s)

    exchange.channel._send = send
    stream = _Stream([CHUNK, b"data: [DONE]\n\n"])
    response: UpstreamResponse = stream  # type: ignore[assignment]

    async def scenario() -> bool:
        exchange.started = time.perf_counter()
        return await relay_stream(exchange, response, stall_s=60.0, total_s=total_s)

    return asyncio.run(scenario()), exchange, stream


def test_a_client_that_stops_reading_is_cut_past_total_s_and_its_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay, "UNREAD_GRACE_S", 0.2)
    failed, exchange, stream = _unread_stream(total_s=0.05, read_after_s=3600)
    assert not failed and stream.aborted and exchange.record.error_after_first_byte


def test_a_slow_reader_within_the_grace_gets_the_whole_stream() -> None:
    failed, exchange, stream = _unread_stream(total_s=0.05, read_after_s=0.3)
    assert not failed and not stream.aborted and not exchange.record.error_after_first_byte


USAGE_ONLY = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'


@pytest.mark.parametrize("gateway_asked", [True, False])
def test_usage_the_client_did_not_ask_for_is_counted_but_not_relayed(gateway_asked: bool) -> None:
    exchange, sent = pinned_exchange()
    exchange.strip_usage = gateway_asked
    stream = _Stream([CHUNK, USAGE_ONLY, b"data: [DONE]\n\n"])
    response: UpstreamResponse = stream  # type: ignore[assignment]
    asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    assert (exchange.record.prompt_tokens, exchange.record.completion_tokens) == (5, 2)
    assert (b'"usage"' in relayed_body(sent)) is not gateway_asked


def test_a_streams_events_reach_the_client_with_the_public_model_name() -> None:
    from gateway.proxy.rewrite import ModelRewriter

    exchange, sent = pinned_exchange()
    exchange.rewrite = ModelRewriter("served/llama-fp8", "llama")
    exchange.captured = []
    event = b'data: {"model":"served/llama-fp8","choices":[]}\n\n'
    response: UpstreamResponse = _Stream([event, b"data: [DONE]\n\n"])  # type: ignore[assignment]
    asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    assert b'"model":"llama"' in relayed_body(sent) and b"served/" not in relayed_body(sent)
    assert b"served/" not in b"".join(exchange.captured)


def test_a_responses_error_event_follows_the_last_event_of_a_batch_of_several() -> None:
    """An engine's read holds several numbered events: the error event follows the last
    of them, however many digits its number has."""
    events = b"".join(
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
        b'"delta":"Hi","sequence_number":%d}\n\n' % number
        for number in (98, 99, 100)
    )
    exchange, sent = pinned_exchange()
    exchange.kind = "responses"
    stream = _Stream([events, UpstreamConnectError("reset")])
    response: UpstreamResponse = stream  # type: ignore[assignment]
    asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    data = relayed_body(sent).rsplit(b"data: ", 1)[-1]
    assert json.loads(data)["sequence_number"] == 101


COMPLETED = (
    b'event: response.completed\ndata: {"type":"response.completed","response":{},'
    b'"sequence_number":9}'
)


@pytest.mark.parametrize("ending", [b"", b"\n"], ids=["no_line_end", "one_line_end"])
def test_a_last_event_without_its_blank_line_reaches_the_client_ended(ending: bytes) -> None:
    """An SSE client dispatches an event at its blank line only: relayed without it, the
    OpenAI SDK dropped the stream's last event (a Responses stream's response.completed, a
    chat stream's finish_reason or usage)."""
    exchange, sent = pinned_exchange()
    exchange.kind = "responses"
    response: UpstreamResponse = _Stream([CHUNK, COMPLETED + ending])  # type: ignore[assignment]
    failed = asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    assert not failed and not exchange.record.error_after_first_byte
    assert relayed_body(sent) == CHUNK + COMPLETED + b"\n\n"


@pytest.mark.parametrize(
    ("kind", "last"),
    [
        ("chat", b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'),
        ("completions", b'data: {"choices":[{"index":0,"text":"Hi"}]}\n\n'),
        ("responses", b'event: response.output_text.delta\ndata: {"sequence_number":4}\n\n'),
        ("chat", b": ping\n\n"),  # a keep-alive after the last event ends nothing either
    ],
)
def test_a_stream_that_ends_at_an_event_boundary_before_its_end_is_a_failure(
    kind: EndpointKind, last: bytes
) -> None:
    """The upstream closed its stream cleanly between two events, before `data: [DONE]` (a
    Responses stream: before its terminal event). The client got a shortened answer as a
    success, the engine counted no failure, and the shadow could take it for a label."""
    exchange, sent = pinned_exchange()
    exchange.kind = kind
    response: UpstreamResponse = _Stream([CHUNK, last])  # type: ignore[assignment]
    failed = asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    assert failed and exchange.record.error_after_first_byte
    body = relayed_body(sent)
    assert body.startswith(CHUNK + last) and b"before its last event" in body[len(CHUNK) :]


@pytest.mark.parametrize(
    ("kind", "end"),
    [
        ("chat", b"data:[DONE]\n\n"),
        ("completions", b"data: [DONE]\n\n: ping\n\n"),
        ("responses", COMPLETED + b"\n\n"),
        ("responses", COMPLETED.replace(b"completed", b"incomplete") + b"\n\n"),
        ("responses", COMPLETED.replace(b"completed", b"failed") + b"\n\n"),
    ],
)
def test_a_stream_that_reaches_its_end_marker_is_no_failure(kind: EndpointKind, end: bytes) -> None:
    exchange, sent = pinned_exchange()
    exchange.kind = kind
    response: UpstreamResponse = _Stream([CHUNK, end])  # type: ignore[assignment]
    assert not asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    assert not exchange.record.error_after_first_byte
    assert relayed_body(sent) == CHUNK + end


def test_a_last_done_without_its_blank_line_is_an_ending_not_a_cut_event() -> None:
    failed, exchange, sent, _ = _stream([CHUNK, b"data: [DONE]"])
    assert not failed and not exchange.record.error_after_first_byte
    assert relayed_body(sent) == CHUNK + b"data: [DONE]\n\n"


# SSE's space after `data:` is optional: an event cut short without it is cut short too.
@pytest.mark.parametrize("cut", [CHUNK[:30], CHUNK[:30].replace(b"data: ", b"data:")])
def test_a_stream_that_ends_mid_event_ends_with_an_error_event(cut: bytes) -> None:
    """An upstream that closed its stream cleanly in the middle of an event: the fragment
    was relayed as it was, the SDK dropped it, and the client got a shortened answer as a
    success, with no error, and the engine counted no failure."""
    failed, exchange, sent, _ = _stream([CHUNK, cut])
    assert failed and exchange.record.error_after_first_byte
    body = relayed_body(sent)
    assert body.startswith(CHUNK) and b"ended the stream mid-event" in body
    assert cut not in body[len(CHUNK) :]
