"""Request fields and response bytes pass through untouched, but for the model name."""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.config import Settings, parse_settings
from gateway.proxy import relay
from gateway.routing.factory import build_policy
from tests.fakes import FakeUpstream, Reply
from tests.helpers import API_KEY, MODEL, GatewayThread, fixed_policy, send, wait_for


@pytest.fixture()
def upstream_pair() -> Iterator[tuple[FakeUpstream, FakeUpstream, GatewayThread]]:
    with FakeUpstream() as cheap, FakeUpstream() as top:
        settings = parse_settings(
            {
                "model": MODEL,
                "tiers": [
                    {
                        "name": "nvfp4",
                        "precision": "nvfp4",
                        "endpoints": [cheap.url],
                        "served_model_name": "served/cheap",
                    },
                    {
                        "name": "bf16",
                        "precision": "bf16",
                        "endpoints": [top.url],
                        "served_model_name": "served/top",
                    },
                ],
                "tenants": [{"name": "t", "api_keys": [API_KEY]}],
            }
        )
        with GatewayThread(settings) as gw:
            yield cheap, top, gw


def two_tiers(cheap: FakeUpstream, top: FakeUpstream, **timeouts: float) -> Settings:
    """nvfp4 on `cheap`, bf16 on `top`, one tenant; `timeouts` as given (connect_s 1)."""
    data: dict[str, Any] = {
        "model": MODEL,
        "tiers": [
            {"name": "nvfp4", "precision": "nvfp4", "endpoints": [cheap.url]},
            {"name": "bf16", "precision": "bf16", "endpoints": [top.url]},
        ],
        "tenants": [{"name": "t", "api_keys": [API_KEY]}],
    }
    if timeouts:
        data["timeouts"] = {"connect_s": 1.0, **timeouts}
    return parse_settings(data)


def call(
    gw: GatewayThread, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, str], bytes]:
    reply = send("POST", f"{gw.url}{path}", body, timeout=10)
    return reply.status, reply.headers, reply.body


# The smallest chat request these tests send.
ASK: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}

EVERY_FIELD = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": 'hé ☃ \u2028 "quoted"'}]},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}},
    },
    "logprobs": True,
    "top_logprobs": 3,
    "n": 2,
    "seed": 7,
    "stop": ["\n\n", "END"],
    "temperature": 0.25,
    "max_tokens": 17,
    "vllm_xargs": {"custom": [1, 2.5, None, True]},
    "guided_json": {"type": "object"},
    "some_future_field": {"nested": {"deep": "value"}},
}


def test_every_request_field_passes_untouched(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread],
) -> None:
    _, top, gw = upstream_pair
    top.reply = Reply(body=b'{"id":"x","model":"served/top","choices":[]}')
    status, _, _ = call(gw, EVERY_FIELD)
    assert status == 200
    path, _ = top.received[-1]
    assert path == "/v1/chat/completions"
    # Only the model and the tenant's prefix-cache namespace (tenants.cache_salt) change.
    assert top.last_json() == {**EVERY_FIELD, "model": "served/top", "cache_salt": "t"}


def test_response_bytes_relayed_with_only_the_model_rewritten(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread],
) -> None:
    _, top, gw = upstream_pair
    body = (
        b'{"id":"chatcmpl-1","object":"chat.completion","model":"served/top","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":"the \\"model\\":\\"served/top\\" text stays \\u2603"}}],'
        b'"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2},"extra":[1.50,1e3]}'
    )
    top.reply = Reply(body=body)
    status, headers, relayed = call(
        gw, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 200
    assert relayed == body.replace(b'"model":"served/top"', f'"model":"{MODEL}"'.encode(), 1)
    assert headers["x-tiergate-tier"] == "bf16"
    assert (
        gw.settled_metric("tiergate_completion_tokens_total", {"tenant": "t", "tier": "bf16"}, 2)
        == 2
    )


def test_sse_events_relayed_faithfully_across_odd_splits(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread],
) -> None:
    cheap, _, gw = upstream_pair
    events = [
        b'data: {"id":"c","object":"chat.completion.chunk","model":"served/cheap","choices":[{"index":0,"delta":{"content":"a\\n\\nb"}}]}\n\n',
        b'data: {"id":"c","object":"chat.completion.chunk","model":"served/cheap","choices":[{"index":0,"delta":{"content":"c"},"finish_reason":"stop"}]}\n\n',
        b'data: {"id":"c","object":"chat.completion.chunk","model":"served/cheap","choices":[],"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(events)
    # Cut the byte stream at awkward places: inside JSON, inside the event separator.
    cuts = [
        0,
        7,
        60,
        len(events[0]) - 1,
        len(events[0]) + 3,
        len(events[0]) + len(events[1]),
        len(stream),
    ]
    cheap.reply = Reply(
        pieces=[stream[a:b] for a, b in itertools.pairwise(cuts)], content_type=b"text/event-stream"
    )
    status, headers, relayed = call(
        gw,
        {
            "model": f"{MODEL}@nvfp4",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert relayed == stream.replace(b'"model":"served/cheap"', f'"model":"{MODEL}"'.encode())
    assert cheap.last_json()["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("together", [False, True], ids=["event-per-chunk", "one-chunk"])
def test_usage_event_is_removed_when_only_the_gateway_asked(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread], together: bool
) -> None:
    cheap, _, gw = upstream_pair
    events = [
        b'data: {"id":"c","model":"served/cheap","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n',
        b'data: {"id":"c","model":"served/cheap","choices":[],"usage":{"prompt_tokens":4,"total_tokens":5,"completion_tokens":1}}\n\n',
        b"data: [DONE]\n\n",
    ]
    # Events that reach the gateway in one read are relayed as one piece, edited the same way.
    pieces = [b"".join(events)] if together else events
    cheap.reply = Reply(pieces=pieces, content_type=b"text/event-stream")
    before = gw.metric("tiergate_prompt_tokens_total", {"tenant": "t", "tier": "nvfp4"})
    status, _, relayed = call(
        gw,
        {"model": f"{MODEL}@nvfp4", "messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    assert status == 200
    assert cheap.last_json()["stream_options"] == {"include_usage": True}
    assert relayed == events[0].replace(b"served/cheap", MODEL.encode()) + events[2]
    labels = {"tenant": "t", "tier": "nvfp4"}
    assert gw.settled_metric("tiergate_prompt_tokens_total", labels, before + 4) == before + 4


def test_per_chunk_usage_stays_off_when_the_client_did_not_ask_for_usage(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread],
) -> None:
    """vLLM sends per-chunk usage only with include_usage too; the gateway's own request for
    the closing usage event must not turn it on (only that event is removed)."""
    cheap, _, gw = upstream_pair
    cheap.reply = Reply(pieces=[b"data: [DONE]\n\n"], content_type=b"text/event-stream")
    options = {"continuous_usage_stats": True}
    status, _, _ = call(
        gw,
        {
            "model": f"{MODEL}@nvfp4",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": options,
        },
    )
    assert status == 200
    assert cheap.last_json()["stream_options"] == {"include_usage": True}


def test_a_json_answer_cut_mid_body_fails_over_and_counts_against_its_endpoint() -> None:
    """Nothing reaches the client before a JSON body is read whole: a body the upstream cuts
    short is a failed attempt (the circuit counts it), and the next tier serves."""
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = Reply(body=b'{"id":', declared_length=500)
        top.reply = Reply(body=b'{"id":"x","model":"served/top","choices":[]}')
        settings = parse_settings(
            {
                "model": MODEL,
                "tiers": [
                    {"name": "nvfp4", "precision": "nvfp4", "endpoints": [cheap.url]},
                    {
                        "name": "bf16",
                        "precision": "bf16",
                        "endpoints": [top.url],
                        "served_model_name": "served/top",
                    },
                ],
                "tenants": [{"name": "t", "api_keys": [API_KEY]}],
            }
        )
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            status, headers, body = call(gw, ASK)
            assert status == 200 and headers["x-tiergate-tier"] == "bf16"
            assert orjson.loads(body)["model"] == MODEL
            circuit = gw.app.runtime.tiers[0].endpoints[0].circuit
            assert circuit.consecutive_failures == 1
            labels = {"tier": "nvfp4", "endpoint": cheap.url, "outcome": "protocol_error"}
            assert gw.settled_metric("tiergate_upstream_attempts_total", labels, 1) == 1


@pytest.mark.parametrize("stalled", [True, False])
def test_a_stream_cut_by_total_s_counts_against_its_engine_only_if_it_stalled(
    stalled: bool,
) -> None:
    """Past the headers only total_s cuts a stream. Cut while events still flow, the limit
    was the request's; cut after a silence longer than first_byte_s, the engine stalled."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = (
            Reply(pieces=[event], silent_after_s=3.0, content_type=b"text/event-stream")
            if stalled
            else Reply(
                pieces=[event] * 60, piece_interval_s=0.05, content_type=b"text/event-stream"
            )
        )
        # A stall is 1 s of silence: twenty times the events' spacing, so a loaded host's
        # pause between two flowing events does not pass for one.
        settings = two_tiers(cheap, top, first_byte_s=1.0, total_s=2.5)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            body = {**ASK, "stream": True}
            status, _, relayed = call(gw, body)
            assert status == 200 and b'"error"' in relayed.rsplit(b"data: ", 1)[-1]
            # The client has the error event before the gateway records the exchange
            # (circuit first, then metrics): wait for the metric, then read the circuit.
            labels = {"tenant": "t", "tier": "nvfp4"}
            assert gw.metric_at_least("tiergate_stream_errors_total", labels, 1) == 1
            circuit = gw.app.runtime.tiers[0].endpoints[0].circuit
            assert circuit.consecutive_failures == (1 if stalled else 0)


def test_a_request_whose_own_deadline_runs_out_before_the_first_byte_blames_nobody() -> None:
    """total_s (1 s) below first_byte_s (5 s): the timer that fires is the request's, so the
    client gets a 504 and no circuit counts a failure, nor is another tier tried."""
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = Reply(delay_s=2.0)
        settings = two_tiers(cheap, top, first_byte_s=5.0, total_s=1.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            status, headers, body = call(gw, ASK)
            assert status == 504 and "total_s" in orjson.loads(body)["error"]["message"]
            assert headers.get("x-should-retry") == "false"  # the SDKs would wait it out again
            assert gw.app.runtime.tiers[0].endpoints[0].circuit.consecutive_failures == 0
            assert top.received == []
            labels = {"tier": "nvfp4", "endpoint": cheap.url, "outcome": "deadline"}
            assert gw.settled_metric("tiergate_upstream_attempts_total", labels, 1) == 1


def test_a_json_answer_silent_past_first_byte_s_until_total_s_counts_against_its_engine() -> None:
    """A JSON answer's headers come when its generation ends, so only total_s bounds the
    wait; but an engine that gave none for longer than first_byte_s when total_s fired has
    hung (else it would never be ejected): its circuit counts it, nothing else is tried."""
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = Reply(delay_s=3.0)
        settings = two_tiers(cheap, top, first_byte_s=0.5, total_s=1.5)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            status, headers, _ = call(gw, ASK)
            assert status == 504 and headers.get("x-should-retry") == "false"
            assert gw.app.runtime.tiers[0].endpoints[0].circuit.consecutive_failures == 1
            assert top.received == []
            labels = {"tier": "nvfp4", "endpoint": cheap.url, "outcome": "timeout"}
            assert gw.settled_metric("tiergate_upstream_attempts_total", labels, 1) == 1


@pytest.mark.parametrize("case", ["too_large", "cut_refusal"])
def test_a_json_answer_no_other_endpoint_should_make_is_not_retried(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer over the size limit is the request's doing (every endpoint would generate
    it again; none is blamed), and a refusal (400) that ends early was still the request's
    answer: the client gets one 502 and the next tier never sees the request."""
    monkeypatch.setattr("gateway.proxy.attempts.MAX_RESPONSE_BYTES", 1000)
    with FakeUpstream() as cheap, FakeUpstream() as top:
        if case == "too_large":
            cheap.reply = Reply(body=b'{"x":"' + b"a" * 2000 + b'"}')
        else:
            cheap.reply = Reply(status=400, body=b'{"error":', declared_length=100)
        settings = two_tiers(cheap, top)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            status, headers, body = call(gw, ASK)
            assert status == 502 and orjson.loads(body)["error"]["message"]
            assert top.received == []
            circuit = gw.app.runtime.tiers[0].endpoints[0].circuit
            assert circuit.consecutive_failures == (0 if case == "too_large" else 1)
            # The OpenAI SDKs would generate the oversized answer again on each retry.
            too_large = case == "too_large"
            assert (headers.get("x-should-retry") == "false") == too_large


def test_completions_endpoint_forwards_to_completions(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread],
) -> None:
    _, top, gw = upstream_pair
    top.reply = Reply(
        body=orjson.dumps({"id": "cmpl", "model": "served/top", "choices": [{"text": "ok"}]})
    )
    status, _, relayed = call(
        gw,
        {"model": MODEL, "prompt": ["a", "b"], "echo": True, "best_of": 2},
        path="/v1/completions",
    )
    assert status == 200 and orjson.loads(relayed)["model"] == MODEL
    assert top.received[-1][0] == "/v1/completions"
    assert top.last_json() == {
        "model": "served/top",
        "prompt": ["a", "b"],
        "echo": True,
        "best_of": 2,
        "cache_salt": "t",
    }


@pytest.mark.parametrize("status", [502, 504])
def test_a_proxys_502_or_504_counts_against_the_endpoint_at_once(status: int) -> None:
    """A gateway status in front of the engine (a proxy's) says the endpoint is broken: its
    circuit counts it without waiting to see another endpoint serve, and the request fails
    over (an engine's own 500 is judged only once another endpoint served)."""
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = Reply(status=status, body=b"<html>bad gateway</html>")
        top.reply = Reply(body=b'{"id":"x","choices":[]}')
        with GatewayThread(two_tiers(cheap, top), policy_factory=fixed_policy(0)) as gw:
            answer, headers, _ = call(gw, ASK)
            assert answer == 200 and headers["x-tiergate-tier"] == "bf16"
            assert gw.app.runtime.tiers[0].endpoints[0].circuit.consecutive_failures == 1


def test_a_json_body_that_outlasts_total_s_is_one_504() -> None:
    """The headers came in time, the body does not: the request's deadline ends it with one
    504 (its time is spent, so no other tier is tried)."""
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = Reply(pieces=[b'{"id":', b'"x"}'], piece_interval_s=3.0)
        settings = two_tiers(cheap, top, first_byte_s=5.0, total_s=1.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            status, _, body = call(gw, ASK)
            assert status == 504 and orjson.loads(body)["error"]["code"] == "upstream_timeout"
            assert top.received == []


def test_a_queue_wait_ends_at_total_s() -> None:
    """Both tiers answer 503 (saturated): the request queues, but for no longer than what
    is left of its total_s (1 s), not the whole queue_timeout_s (3 s)."""
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = top.reply = Reply(status=503)
        settings = parse_settings(
            {
                "model": MODEL,
                "tiers": [
                    {"name": "nvfp4", "precision": "nvfp4", "endpoints": [cheap.url]},
                    {"name": "bf16", "precision": "bf16", "endpoints": [top.url]},
                ],
                "tenants": [{"name": "t", "api_keys": [API_KEY]}],
                "timeouts": {"total_s": 1.0},
                "resilience": {"queue_timeout_s": 3.0},
            }
        )
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            started = time.monotonic()
            status, _, body = call(gw, ASK)
            assert status == 429 and orjson.loads(body)["error"]["code"] == "tiers_saturated"
            assert time.monotonic() - started < 2.0


def test_a_stream_silent_after_its_headers_fails_over_within_first_byte_s() -> None:
    """vLLM sends a stream's headers before its engine schedules the request: a stalled
    engine answers headers, then nothing. first_byte_s (0.5 s) bounds the wait for the first
    event, and as nothing reached the client yet, the top tier serves (it waited 2 s, 4 s in
    all, on the stalled tier)."""
    event = b'data: {"id":"c","object":"chat.completion.chunk","model":"served/top","choices":[]}\n\ndata: [DONE]\n\n'
    with FakeUpstream() as cheap, FakeUpstream() as top:
        kind = b"text/event-stream"
        cheap.reply = Reply(pieces=[b"", event], piece_interval_s=2.0, content_type=kind)
        top.reply = Reply(pieces=[event], content_type=kind)
        settings = two_tiers(cheap, top, first_byte_s=0.5, total_s=10.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            started = time.monotonic()
            status, headers, body = call(gw, {**ASK, "stream": True})
            assert status == 200 and headers["x-tiergate-tier"] == "bf16"
            assert body.endswith(b"data: [DONE]\n\n")
            assert time.monotonic() - started < 1.8
            assert gw.app.runtime.tiers[0].endpoints[0].circuit.consecutive_failures == 1


def _stream_failed_over_from(cheap_reply: Reply) -> None:
    """A stream request whose cheap tier answers `cheap_reply`: the top tier serves it whole,
    and the cheap endpoint's circuit counts the failure."""
    event = b'data: {"id":"c","object":"chat.completion.chunk","model":"served/top","choices":[]}\n\ndata: [DONE]\n\n'
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = cheap_reply
        top.reply = Reply(pieces=[event], content_type=b"text/event-stream")
        settings = two_tiers(cheap, top, first_byte_s=1.0, total_s=5.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            status, headers, body = call(gw, {**ASK, "stream": True})
            assert status == 200 and headers["x-tiergate-tier"] == "bf16"
            assert body.endswith(b"data: [DONE]\n\n")
            assert gw.app.runtime.tiers[0].endpoints[0].circuit.consecutive_failures == 1


def test_a_stream_that_ends_before_its_first_event_fails_over() -> None:
    """A 200 stream whose body ends empty answered nothing: relayed, the client got an empty
    200 and no error. Nothing reached the client, so the next tier serves, and the empty
    answer counts against its endpoint."""
    _stream_failed_over_from(Reply(pieces=[], content_type=b"text/event-stream"))


def test_a_keep_alive_comment_is_not_a_first_event() -> None:
    """An engine that sends `: ping` and then nothing within first_byte_s has not started
    its answer: nothing reached the client (the comment is held), so the next tier serves."""
    ping = b": ping\n\n"
    answer = b'data: {"choices":[]}\n\ndata: [DONE]\n\n'
    stalled = Reply(pieces=[ping, answer], piece_interval_s=3.0, content_type=b"text/event-stream")
    _stream_failed_over_from(stalled)


def test_a_stream_of_keep_alives_alone_fails_over() -> None:
    _stream_failed_over_from(
        Reply(pieces=[b": ping\n\n: ping\n\n"], content_type=b"text/event-stream")
    )


def _responses_event(kind: str, fields: str) -> bytes:
    return b'event: %s\ndata: {"type":"%s",%s}\n\n' % (
        kind.encode(),
        kind.encode(),
        fields.encode(),
    )


# A Responses stream as vLLM frames it: the opening two events come with the headers, before
# the engine has scheduled the request; the answer follows.
RESPONSE_OBJECT = '"response":{"id":"r","object":"response","model":"m","tools":[{"type":"function","name":"f"}],"usage":null}'
RESPONSES_OPENING = _responses_event("response.created", RESPONSE_OBJECT) + _responses_event(
    "response.in_progress", RESPONSE_OBJECT
)
RESPONSES_ANSWER = _responses_event(
    "response.output_text.delta", '"item_id":"m","output_index":0,"content_index":0,"delta":"hi"'
) + _responses_event(
    "response.completed",
    '"response":{"id":"r","object":"response","model":"m","usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}',
)


def stalled_responses_stream(
    pieces: list[bytes], interval_s: float, first_byte_s: float, **ask: Any
) -> tuple[int, dict[str, str], bytes, float]:
    """A Responses stream whose cheap tier sends `pieces` `interval_s` apart, the top tier
    the whole answer at once: status, headers, body and seconds of the answer."""
    with FakeUpstream() as cheap, FakeUpstream() as top:
        kind = b"text/event-stream"
        cheap.reply = Reply(pieces=pieces, piece_interval_s=interval_s, content_type=kind)
        top.reply = Reply(pieces=[RESPONSES_OPENING + RESPONSES_ANSWER], content_type=kind)
        settings = two_tiers(cheap, top, first_byte_s=first_byte_s, total_s=10.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            started = time.monotonic()
            body = {"model": MODEL, "input": "x", "stream": True, **ask}
            status, headers, relayed = call(gw, body, "/v1/responses")
            return status, headers, relayed, time.monotonic() - started


def test_a_responses_stream_silent_after_its_opening_events_fails_over_within_first_byte_s() -> (
    None
):
    """vLLM sends response.created and response.in_progress before its engine schedules the
    request: a stalled engine sent those, then nothing, and the attempt counted them as the
    first event: the client waited on the stalled tier (2 s here), with no failover."""
    status, headers, body, seconds = stalled_responses_stream(
        [RESPONSES_OPENING, RESPONSES_ANSWER], 2.0, first_byte_s=0.5
    )
    assert status == 200 and headers["x-tiergate-tier"] == "bf16"
    assert body == RESPONSES_OPENING + RESPONSES_ANSWER
    assert seconds < 1.8


def test_a_responses_streams_time_to_first_token_is_not_its_opening_events() -> None:
    """tiergate_time_to_first_token_seconds read the time to response.created, which vLLM
    sends before the engine runs: about 0 however long the prefill took (0.6 s here)."""
    with FakeUpstream() as only:
        only.reply = Reply(
            pieces=[RESPONSES_OPENING, RESPONSES_ANSWER],
            piece_interval_s=0.6,
            content_type=b"text/event-stream",
        )
        settings = two_tiers(only, only, first_byte_s=5.0, total_s=10.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            status, _, body = call(
                gw, {"model": MODEL, "input": "x", "stream": True}, "/v1/responses"
            )
            assert status == 200 and body == RESPONSES_OPENING + RESPONSES_ANSWER
            labels = {"tenant": "t", "tier": "nvfp4"}
            assert gw.metric_at_least("tiergate_time_to_first_token_seconds_count", labels, 1) == 1
            assert gw.metric("tiergate_time_to_first_token_seconds_sum", labels) >= 0.55
            tokens = gw.metric_at_least("tiergate_completion_tokens_total", labels, 1)
            assert tokens == 1


def test_a_responses_stream_whose_opening_events_fill_the_read_buffer_is_served() -> None:
    """The opening events echo the request's tools and instructions: past 1 MiB the read
    pauses until the relay reads, so waiting past them for more would wait out first_byte_s."""
    instructions = "y" * 600_000
    echo = f'"response":{{"id":"r","object":"response","instructions":"{instructions}"}}'
    opening = _responses_event("response.created", echo) + _responses_event(
        "response.in_progress", echo
    )
    status, headers, body, _ = stalled_responses_stream(
        [opening, RESPONSES_ANSWER], 0.2, first_byte_s=1.5, instructions=instructions
    )
    assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"
    assert body == opening + RESPONSES_ANSWER


def test_a_responses_opening_event_that_arrives_in_pieces_is_still_waited_past() -> None:
    """vLLM writes an event's type last (`{"response":{...},"sequence_number":0,"type":...}`),
    and response.created echoes the request's tools and instructions, so it may arrive in
    several reads: its first piece, with no type yet, was taken for the first event, and a
    stalled engine was waited on (2 s here) instead of failed over within first_byte_s."""
    echo = '{"response":{"id":"r","object":"response","instructions":"%s"},"sequence_number":%d,"type":"%s"}'
    created = (
        b"event: response.created\ndata: %s\n\n"
        % (echo % ("y" * 1000, 0, "response.created")).encode()
    )
    in_progress = (
        b"event: response.in_progress\ndata: %s\n\n"
        % (echo % ("y" * 1000, 1, "response.in_progress")).encode()
    )
    status, headers, body, seconds = stalled_responses_stream(
        [created[:500], created[500:] + in_progress, RESPONSES_ANSWER], 1.0, first_byte_s=1.5
    )
    assert status == 200 and headers["x-tiergate-tier"] == "bf16"
    assert body == RESPONSES_OPENING + RESPONSES_ANSWER
    # 1.5 s (first_byte_s from the attempt's start); a wait restarted by the opening
    # events' second piece would take 2.5 s. Under 1.9 left a loaded host 0.4 s.
    assert seconds < 2.2


def test_a_responses_request_reaches_the_engine_with_store_off(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread],
) -> None:
    """A response an engine stored could be fetched from that engine only, never through the
    gateway, and vLLM never frees it: the gateway sends store false, the rest untouched."""
    _, top, gw = upstream_pair
    top.reply = Reply(body=b'{"id":"resp_1","object":"response","model":"served/top"}')
    asked = {"model": MODEL, "input": "hi", "store": True, "metadata": {"k": "v"}}
    reply = send("POST", f"{gw.url}/v1/responses", asked)
    assert reply.status == 200
    path, _ = top.received[-1]
    assert path == "/v1/responses"
    assert top.last_json() == {**asked, "model": "served/top", "store": False, "cache_salt": "t"}


def test_a_client_that_stops_reading_its_stream_holds_no_slot_past_total_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that stops reading but keeps its socket open blocks every write to it: the
    upstream is cut at total_s, and the exchange must end too, or its endpoint slot and its
    tenant's concurrency slot are held for as long as the client keeps the socket."""
    monkeypatch.setattr(relay, "UNREAD_GRACE_S", 0.3, raising=False)
    event = b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % (b"x" * 65000)
    with FakeUpstream() as cheap, FakeUpstream() as top:
        # ~25 MB: more than every buffer between the engine and the client holds.
        cheap.reply = Reply(pieces=[event] * 400, content_type=b"text/event-stream")
        settings = two_tiers(cheap, top, first_byte_s=1.0, total_s=1.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw, socket.socket() as c:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", gw.port))
            body = orjson.dumps({**ASK, "stream": True})
            c.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
                % (API_KEY.encode(), len(body), body)
            )
            assert c.recv(12) == b"HTTP/1.1 200"  # then reads no more
            endpoint = gw.app.runtime.tiers[0].endpoints[0]
            deadline = time.monotonic() + 5
            while endpoint.inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            assert endpoint.inflight == 0
            labels = {"tenant": "t", "tier": "nvfp4"}
            assert gw.metric_at_least("tiergate_stream_errors_total", labels, 1) == 1


@pytest.mark.parametrize("served", [True, False], ids=["answer", "error"])
def test_an_answer_its_client_never_takes_holds_no_slot(served: bool) -> None:
    """A client that sends requests on one connection (pipelined) and reads none of the
    answers: once the buffers fill, uvicorn's `send` waits for it to read. A JSON answer (or
    an error) written then waited for good, holding the endpoint's slot and the tenant's
    concurrency slot, and the request was never recorded; as for a stream, the wait is
    bounded (by limits.body_timeout_s, the client's time to send a body)."""
    import asyncio

    from gateway.app import build_app
    from gateway.coarse_timers import CoarseTimers

    usage = b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}'
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = Reply(body=b'{"id":"x","choices":[],' + usage + b"}")
        data = two_tiers(cheap, top).model_dump(mode="json")
        data["tenants"] = [{"name": "t", "api_keys": [API_KEY], "limits": {"max_concurrency": 1}}]
        asked = ASK if served else {**ASK, "model": f"{MODEL}@nosuch"}  # a 404 after admission
        app = build_app(parse_settings(data), environ={}, policy_factory=fixed_policy(0))

        async def main() -> None:
            handler = app.runtime.hot_routes["/v1/chat/completions"]
            now = [0.0]
            handler._body_deadlines = CoarseTimers(30.0, lambda: now[0])
            answering = asyncio.Event()

            async def send(message: dict[str, Any]) -> None:
                answering.set()
                await asyncio.Event().wait()  # the client reads nothing

            messages = [{"type": "http.request", "body": orjson.dumps(asked)}]

            async def receive() -> dict[str, Any]:
                if messages:
                    return messages.pop()
                await asyncio.Event().wait()  # the client stays connected
                return {}

            authorization = (b"authorization", b"Bearer " + API_KEY.encode())
            scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
            scope["headers"] = [authorization]
            served_request = asyncio.create_task(app(scope, receive, send))
            try:
                await answering.wait()
                assert app.admission.inflight["t"] == 1
                now[0] += 31.0
                handler._body_deadlines.sweep_once()
                await asyncio.wait_for(served_request, 5.0)
                assert app.admission.inflight["t"] == 0
                assert app.runtime.tiers[0].endpoints[0].inflight == 0
            finally:
                for tier in app.runtime.tiers:
                    tier.close()

        asyncio.run(main())
        app.metrics.flush()
        tier = "nvfp4" if served else "_none"
        labels = {"tenant": "t", "tier": tier, "endpoint": "chat", "status": "499"}
        assert app.registry.get_sample_value("tiergate_requests_total", labels) == 1


@pytest.mark.parametrize("ending", [b"\n\ndata: [DONE]\n\n", b""], ids=["then_done", "unended"])
def test_an_engines_error_event_mid_stream_is_a_stream_error_and_its_failure(
    ending: bytes,
) -> None:
    """vLLM yields `data: {"error": ...}` and [DONE] when generation fails after the
    headers: relayed as it is, but it was counted a success (no stream error, the circuit
    closed on it). Last in a stream that ends without its blank line, it was missed too."""
    chunk = b'data: {"id":"c","object":"chat.completion.chunk","model":"served/cheap","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    error = b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}'
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = Reply(
            pieces=[chunk, error + ending],
            piece_interval_s=0.05,
            content_type=b"text/event-stream",
        )
        settings = two_tiers(cheap, top, first_byte_s=1.0, total_s=5.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            status, _, body = call(gw, {**ASK, "stream": True})
            assert status == 200 and error in body
            assert body.endswith(b"data: [DONE]\n\n") or not ending
            labels = {"tenant": "t", "tier": "nvfp4"}
            assert gw.metric_at_least("tiergate_stream_errors_total", labels, 1) == 1
            assert gw.app.runtime.tiers[0].endpoints[0].circuit.consecutive_failures == 1


def test_an_event_that_never_ends_is_cut_past_the_response_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An upstream that never sends the blank line ending an event was buffered until
    total_s (15 minutes by default), with no bound like a JSON body's."""
    monkeypatch.setattr(relay, "MAX_RESPONSE_BYTES", 256 * 1024)
    first = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    endless = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 65536
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = Reply(
            pieces=[first, *[endless] * 64],
            piece_interval_s=0.01,
            content_type=b"text/event-stream",
        )
        settings = two_tiers(cheap, top, first_byte_s=1.0, total_s=30.0)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            started = time.monotonic()
            status, _, body = call(gw, {**ASK, "stream": True})
            assert time.monotonic() - started < 10.0
            assert status == 200 and body.startswith(first)
            assert b'"error"' in body and b"[DONE]" not in body and b"x" * 100 not in body
            labels = {"tenant": "t", "tier": "nvfp4"}
            assert gw.metric_at_least("tiergate_stream_errors_total", labels, 1) == 1


def test_a_json_answer_to_a_stream_request_fails_over() -> None:
    """An upstream that ignored `stream` and answered JSON was relayed under
    text/event-stream: the SDK saw an empty stream. Nothing reached the client yet, so the
    next tier serves, and the answer counts against its endpoint."""
    _stream_failed_over_from(Reply(pieces=[b'{"id":"c","object":"chat.completion","choices":[]}']))


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        (b"text/html; charset=utf-8", b"<html>Service is starting</html>"),  # a proxy's page
        (b"", b'{"id":"c","object":"chat.completion","choices":[]}'),  # JSON, unlabelled
    ],
)
def test_a_stream_answer_that_is_no_event_stream_fails_over(
    content_type: bytes, body: bytes
) -> None:
    """Relayed, either reached the client as a 200 event stream with no event in it."""
    _stream_failed_over_from(Reply(pieces=[body], content_type=content_type))


def test_a_captured_exchange_holds_the_size_of_its_request_and_answer(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread],
) -> None:
    """What the listeners' queues bound in bytes: the client's body and the relayed answer."""
    _, top, gw = upstream_pair
    answer = b'{"id":"x","model":"served/top","choices":[]}'
    top.reply = Reply(body=answer)
    captured: list[Any] = []
    observer: Any = gw.app.observer
    observer.wants_capture = lambda *_: True
    observer.exchange_done = captured.append
    body = orjson.dumps({**ASK, "padding": "x" * 5000})
    status, _, relayed = call(gw, body)  # type: ignore[arg-type]
    assert status == 200
    # The listeners hear of the exchange after its last byte reached the client.
    (exchange,) = wait_for(lambda: captured)
    assert exchange.request_bytes == len(body)
    assert exchange.size == len(body) + len(relayed)


def test_the_overhead_leaves_out_the_clients_upload(
    upstream_pair: tuple[FakeUpstream, FakeUpstream, GatewayThread],
) -> None:
    """A client that paused 1.5 s between its head and its body was reported as 1,500 ms of
    gateway overhead (the header and tiergate_gateway_overhead_seconds)."""
    _, top, gw = upstream_pair
    top.reply = Reply(body=b'{"id":"x","model":"served/top","choices":[]}')
    body = orjson.dumps(ASK)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {API_KEY}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as client:
        client.sendall(head)
        time.sleep(1.5)
        client.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += client.recv(65536)
    status, *lines = answer.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    assert status.split()[1] == "200"
    assert float(headers["x-tiergate-overhead-ms"]) < 1000  # about 1 ms; the pause 1,500


def test_a_captured_exchange_names_the_router_model_that_scored_it() -> None:
    """Its score means something only to that model: the recalibrator drops a label whose
    model a reload has swapped out while the exchange (or its replay) was out."""
    with FakeUpstream() as cheap, FakeUpstream() as top:
        cheap.reply = top.reply = Reply(body=b'{"id":"x","model":"m","choices":[]}')
        with GatewayThread(two_tiers(cheap, top), policy_factory=build_policy) as gw:
            captured: list[Any] = []
            observer: Any = gw.app.observer
            observer.wants_capture = lambda *_: True
            observer.exchange_done = captured.append
            status, _, _ = call(gw, ASK)
            assert status == 200
            (exchange,) = wait_for(lambda: captured)
            assert exchange.score is not None  # the router decided
            policy: Any = gw.app.runtime.policy
            assert exchange.router_model is not None
            assert exchange.router_model == policy.model_id
