from __future__ import annotations

import itertools
import time

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol import EndpointKind
from gateway.proxy.rewrite import (
    ModelRewriter,
    SSEBuffer,
    holds_no_output,
    split_usage_event,
    usage_counts,
)


def test_model_rewriter_touches_only_the_model_key() -> None:
    rewrite = ModelRewriter("served", "public")
    body = orjson.dumps(
        {"model": "served", "content": '"model":"served" inside text', "x": "served"}
    )
    assert orjson.loads(rewrite(body)) == {
        "model": "public",
        "content": '"model":"served" inside text',
        "x": "served",
    }
    assert rewrite(b'{"model": "served"}') == b'{"model": "public"}'
    assert ModelRewriter("same", "same")(body) is body


@given(st.text(min_size=1, max_size=30))
def test_model_rewriter_handles_any_name(name: str) -> None:
    body = orjson.dumps({"id": 1, "model": name, "echo": name})
    assert orjson.loads(ModelRewriter(name, "pub")(body)) == {"id": 1, "model": "pub", "echo": name}


def test_usage_counts_with_nested_details() -> None:
    body = b'{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3},"completion_tokens":2},"z":1}'
    assert usage_counts(body) == (5, 2)
    assert usage_counts(b'{"usage":null}') is None
    assert usage_counts(b'{"usage":{"prompt_tokens":"x","completion_tokens":1}}') is None
    assert usage_counts(b"no usage here") is None


def test_usage_counts_refuse_a_negative_count() -> None:
    # Counted, it failed the counters' increment, which lost the batch of every request
    # recorded since the last flush and ended the gateway's flush timer for good.
    assert usage_counts(b'{"usage":{"prompt_tokens":-50,"completion_tokens":3}}') is None
    assert usage_counts(b'{"usage":{"input_tokens":4,"output_tokens":-1}}') is None
    assert usage_counts(b'{"usage":{"prompt_tokens":0,"completion_tokens":0}}') == (0, 0)


events = st.lists(
    st.builds(
        lambda text: (
            b"data: " + orjson.dumps({"choices": [{"delta": {"content": text}}]}) + b"\n\n"
        ),
        st.text(max_size=20),
    ),
    min_size=1,
    max_size=8,
)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
@given(events, st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_sse_buffer_yields_whole_events_in_order_as_they_arrive(
    newline: bytes, evts: list[bytes], cuts: list[int]
) -> None:
    """Whole events, in order, each as soon as its last byte is read, however the reads
    split the stream. SSE lines may end in CRLF or CR too: cut only at LF pairs, such a
    stream was held back whole until it ended (time to first token = the whole answer).
    Relayed, events end in LF, a CRLF split between two reads included."""
    stream = b"".join(evts).replace(b"\n", newline)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    buffer = SSEBuffer()
    out = []
    for a, b in itertools.pairwise(points):
        piece = buffer.feed(stream[a:b])
        if piece:
            assert piece.endswith(b"\n\n") and b"\r" not in piece
            out.append(piece)
        # Every whole event that has arrived is out, a CR-framed one included: at most the
        # incomplete one waits.
        arrived = stream[:b].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = arrived.rfind(b"\n\n")
        assert b"".join(out) == (arrived[: end + 2] if end >= 0 else b"")
    out.append(buffer.flush())
    assert b"".join(out) == b"".join(evts)


def test_sse_buffer_holds_a_large_event_in_linear_time() -> None:
    """An event of many reads (a Responses `response.completed` echoes the whole answer) is
    joined once whole: joining and searching the held bytes at every read took 7.7 s of
    the event loop for 32 MiB in 64 KiB reads, every other stream of the worker waiting."""
    buffer, piece = SSEBuffer(), b"x" * 65536
    started = time.perf_counter()
    for _ in range(512):
        assert buffer.feed(piece) == b""
    event = buffer.feed(b"\n\n")
    assert time.perf_counter() - started < 1.5
    assert len(event) == 512 * 65536 + 2 and event.endswith(b"x\n\n")


def test_split_usage_event() -> None:
    first = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
    done = b"data: [DONE]\n\n"
    assert split_usage_event(first + usage + done) == (first + done, usage)
    assert split_usage_event(first + done) == (first + done, b"")


def test_usage_counts_takes_the_last_usage_in_a_batch_of_events() -> None:
    """With continuous usage stats every chunk carries running totals: the last is the
    request's usage, not the first."""
    events = (
        b'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":7,"completion_tokens":1}}\n\n'
        b'data: {"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
    )
    assert usage_counts(events) == (7, 3)


def test_split_usage_event_with_a_space_after_the_colon() -> None:
    first = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
    usage = b'data: {"choices":[], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}\n\n'
    done = b"data: [DONE]\n\n"
    assert split_usage_event(first + usage + done) == (first + done, usage)
    # As Python's json.dumps writes it: a space after every colon, the empty choices too.
    spaced = usage.replace(b'"choices":[]', b'"choices": []')
    assert split_usage_event(first + spaced + done) == (first + done, spaced)


def test_usage_counts_needs_both_counts_to_be_integers() -> None:
    """A usage object with a null completion count has no counts to charge: None, not a
    pair with None in it (callers subtract and add them)."""
    assert usage_counts(b'{"usage":{"prompt_tokens":10,"completion_tokens":null}}') is None
    assert usage_counts(b'{"usage":{"prompt_tokens":10,"completion_tokens":3}}') == (10, 3)


def test_split_usage_event_keeps_an_empty_choices_event_without_usage() -> None:
    """`"choices":[]` alone is not the usage event the gateway asked for: it stays."""
    events = b'data: {"id":"c","choices":[]}\n\ndata: {"choices":[{"delta":{}}]}\n\n'
    assert split_usage_event(events) == (events, b"")


def test_what_holds_no_output() -> None:
    """Keep-alive comments, and a Responses stream's opening events, are no output: they
    neither set the first-token time nor end the first-byte wait. Anything else is."""
    opening = b'event: response.created\ndata: {"type":"response.created"}\n\n'
    delta = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n'
    chunk = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    assert holds_no_output("responses", opening)
    assert holds_no_output("responses", b": keep-alive\n\n" + opening + b":\r\n\r\n")
    assert not holds_no_output("responses", opening + delta)
    for kind in ("chat", "completions", "responses"):
        assert holds_no_output(kind, b"")
        assert holds_no_output(kind, b": ping\n\n")
        assert holds_no_output(kind, b": ping\r\n\r\n:\n\n")
    assert not holds_no_output("chat", chunk)
    assert not holds_no_output("chat", b": ping\n\n" + chunk)
    assert not holds_no_output("completions", b": ping\r\rdata: [DONE]\r\r")


@pytest.mark.parametrize("kind", ["chat", "completions", "responses"])
@pytest.mark.parametrize(
    "keep_alives",
    [b": ping\r\r: ping\r\r", b"\n: ping\n\n", b"\r\n: ping\r\n\r\n", b"\n"],
)
def test_keep_alives_in_any_framing_hold_no_output(kind: EndpointKind, keep_alives: bytes) -> None:
    """CR-framed comments (a lone CR ends a line, as SSEBuffer reads it) and a blank line
    before a comment are no output on every endpoint: an engine that sends them and stalls
    fails over like one that sends `: ping` and LFs."""
    output = b'data: {"type":"response.completed"}\n\n'
    assert holds_no_output(kind, keep_alives)
    assert not holds_no_output(kind, keep_alives + output)


def test_a_responses_event_of_no_response_type_is_output() -> None:
    """A Responses stream's `error` event (type "error") is what the client gets instead of
    an answer: it ends the first-byte wait like any output."""
    error = b'event: error\ndata: {"type":"error","message":"engine died"}\n\n'
    assert not holds_no_output("responses", error)
    assert not holds_no_output("responses", b"data: {}\n\n")


def test_both_opening_events_of_a_responses_stream_hold_no_output() -> None:
    created = b'event: response.created\ndata: {"type":"response.created"}\n\n'
    in_progress = b'event: response.in_progress\ndata: {"type":"response.in_progress"}\n\n'
    assert holds_no_output("responses", in_progress)
    assert holds_no_output("responses", created + in_progress)


def test_split_usage_event_takes_the_usage_event_not_an_earlier_empty_choices_one() -> None:
    """Both in one read: the event without usage was taken out (the client lost it) and the
    usage event the client had not asked for was relayed."""
    empty = b'data: {"id":"c","choices":[],"prompt_filter_results":[]}\n\n'
    first = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
    done = b"data: [DONE]\n\n"
    assert split_usage_event(empty + first + usage + done) == (empty + first + done, usage)
