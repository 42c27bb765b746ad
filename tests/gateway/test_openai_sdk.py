"""The official OpenAI SDK against a running gateway with simulated tiers."""

from __future__ import annotations

import http.client
import json
import math
import re
import subprocess
import sys
import time
from typing import Any, Literal

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from gateway.launcher import banner
from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, send


@pytest.fixture()
def client(gw: GatewayThread) -> OpenAI:
    return OpenAI(base_url=f"{gw.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


def test_chat_non_stream_names_the_serving_tier(client: OpenAI, gw: GatewayThread) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    completion = raw.parse()
    assert raw.headers["x-tiergate-tier"] == "bf16"  # the placeholder policy: top tier
    assert float(raw.headers["x-tiergate-overhead-ms"]) >= 0.0
    assert completion.model == MODEL  # rewritten from the tier's served name
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    labels = {"tenant": "default", "tier": "bf16"}
    deadline = time.monotonic() + 5
    while gw.metric("tiergate_completion_tokens_total", labels) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gw.metric("tiergate_completion_tokens_total", labels) >= 8


def test_chat_stream_with_usage(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "tell me something"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(chunk.model == MODEL for chunk in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == 12 and usage.prompt_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_stream_without_usage_hides_it_but_counts_tokens(client: OpenAI, gw: GatewayThread) -> None:
    labels = {"tenant": "default", "tier": "nvfp4"}
    before = gw.metric("tiergate_completion_tokens_total", labels)
    chunks = list(
        client.chat.completions.create(
            model=f"{MODEL}@nvfp4",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=9,
            stream=True,
        )
    )
    # The gateway asked upstream for usage itself; the client did not, so it sees none.
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)
    assert gw.settled_metric("tiergate_completion_tokens_total", labels, before + 9) == before + 9
    assert gw.metric("tiergate_unmetered_requests_total", labels) == 0  # its usage was counted


def test_completions_stream_and_not(client: OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6)
    assert completion.model == MODEL and len(completion.choices[0].text.split()) == 6
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == completion.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_completions_length_follows_vllm(client: OpenAI) -> None:
    """vLLM's completions endpoint generates 16 tokens when max_tokens is unset and ignores
    max_completion_tokens (a chat field); the simulated tiers do the same."""
    long_answer = "Write a very long story about the sea, " * 4
    unset = client.completions.create(model=MODEL, prompt=long_answer)
    assert unset.usage is not None and unset.usage.completion_tokens == 16
    ignored = client.completions.create(
        model=MODEL, prompt=long_answer, max_tokens=5, extra_body={"max_completion_tokens": 40}
    )
    assert ignored.usage is not None and ignored.usage.completion_tokens == 5


def test_completions_answer_every_prompt_of_a_list(client: OpenAI) -> None:
    prompts = ["Once upon a time", "Rewrite this: the quick brown fox"]
    model = f"{MODEL}@bf16"
    both = client.completions.create(model=model, prompt=prompts, max_tokens=5, n=2, seed=3)
    # As vLLM: n choices per prompt, prompt-major, each prompt answered on its own.
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    alone = [
        client.completions.create(model=model, prompt=prompt, max_tokens=5, n=2, seed=3)
        for prompt in prompts
    ]
    assert [c.text for c in both.choices] == [c.text for one in alone for c in one.choices]
    assert both.choices[0].text != both.choices[2].text
    assert both.usage is not None
    assert both.usage.prompt_tokens == sum(one.usage.prompt_tokens for one in alone if one.usage)
    assert both.usage.completion_tokens == 4 * 5
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(
        model=model, prompt=prompts, max_tokens=5, n=2, seed=3, stream=True
    ):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {c.index: c.text for c in both.choices}
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=[], max_tokens=5)


def test_logprobs_are_well_formed_and_match_the_text(client: OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "name three rivers"}]
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=7, logprobs=True, top_logprobs=3
    )
    choice = chat.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content and len(content) == 7
    for token in content:
        assert token.top_logprobs[0].token == token.token
        ranked = [t.logprob for t in token.top_logprobs]
        assert len(ranked) == 3 and ranked == sorted(ranked, reverse=True) and ranked[0] < 0
        assert sum(math.exp(lp) for lp in ranked) <= 1.0
        assert bytes(token.bytes or []).decode() == token.token
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=7, logprobs=True, stream=True
    )
    tokens, text = [], ""
    for chunk in stream:
        for delta in chunk.choices:
            text += delta.delta.content or ""
            if delta.logprobs is not None and delta.logprobs.content is not None:
                tokens += [t.token for t in delta.logprobs.content]
                assert all(t.top_logprobs == [] for t in delta.logprobs.content)
    assert "".join(tokens) == text == choice.message.content
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    assert plain.choices[0].logprobs is None  # not asked for, not sent
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, top_logprobs=2)
    assert "logprobs" in str(refused.value)

    completion = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, logprobs=2
    )
    text_choice = completion.choices[0]
    logprobs = text_choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == text_choice.text
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(6)]
    assert logprobs.top_logprobs is not None
    assert all(
        len(top) == 2 and tok in top
        for tok, top in zip(logprobs.tokens, logprobs.top_logprobs, strict=True)
    )
    offsets: list[int] = []
    for chunk in client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, logprobs=2, stream=True
    ):
        for part in chunk.choices:
            if part.logprobs is not None and part.logprobs.text_offset is not None:
                offsets += part.logprobs.text_offset
    assert offsets == logprobs.text_offset


def test_a_stop_string_ends_the_answer_before_it(client: OpenAI) -> None:
    asked: Any = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12}
    whole = client.completions.create(**asked).choices[0].text
    stop = whole[7:10]  # inside the answer, wherever the words break
    cut = client.completions.create(**asked, stop=["never there", stop]).choices[0]
    assert cut.text == whole[: whole.find(stop)] and cut.finish_reason == "stop"
    assert (cut.model_extra or {})["stop_reason"] == stop  # vLLM names the string
    events = list(client.completions.create(**asked, stop=stop, stream=True))
    assert "".join(e.choices[0].text for e in events if e.choices) == cut.text
    assert (events[-1].choices[0].model_extra or {})["stop_reason"] == stop
    assert (client.completions.create(**asked).choices[0].model_extra or {})["stop_reason"] is None


def test_a_streamed_tool_call_keeps_every_tokens_logprob(client: OpenAI) -> None:
    tools: Any = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    messages: Any = [{"role": "user", "content": "find me the weather in paris"}]
    asked: Any = {"model": MODEL, "messages": messages, "tools": tools, "logprobs": True}
    whole = client.chat.completions.create(**asked)
    tokens = [t.token for t in (whole.choices[0].logprobs.content or [])]  # type: ignore[union-attr]
    assert whole.usage is not None and len(tokens) == whole.usage.completion_tokens > 1
    streamed: list[str] = []
    calls = 0
    for event in client.chat.completions.create(**asked, stream=True):
        for choice in event.choices:
            calls += len(choice.delta.tool_calls or [])
            if choice.logprobs is not None and choice.logprobs.content is not None:
                streamed += [t.token for t in choice.logprobs.content]
    assert calls == 1 and streamed == tokens
    # A stop string cuts the call's text, as vLLM cuts any output before parsing it for
    # calls: the cut call does not parse, so the answer is the text before the stop string.
    stopped = client.chat.completions.create(**asked, stop=["{", "query"])
    assert stopped.choices[0].finish_reason == "stop" and not stopped.choices[0].message.tool_calls
    assert stopped.choices[0].message.content == ""
    assert stopped.usage is not None and stopped.usage.completion_tokens == 1


class Address(BaseModel):
    city: str
    zip: str | None


class Person(BaseModel):
    name: str
    age: int
    tags: list[str]
    kind: Literal["friend", "colleague"]
    home: Address
    friends: list[Person]  # recursive: the simulator bounds the nesting


def test_structured_output_parses_into_the_callers_model(client: OpenAI) -> None:
    # vLLM decodes under the schema's grammar, so the SDK's parse helpers load the answer;
    # the simulated tiers' filler words must keep to the same contract.
    asked: Any = {"model": MODEL, "messages": [{"role": "user", "content": "a person"}]}
    parsed = client.chat.completions.parse(**asked, response_format=Person, n=2)
    assert all(isinstance(c.message.parsed, Person) for c in parsed.choices)
    with client.chat.completions.stream(**asked, response_format=Person) as stream:
        assert isinstance(stream.get_final_completion().choices[0].message.parsed, Person)
    answer = client.responses.parse(model=MODEL, input="a person", text_format=Person)
    assert isinstance(answer.output_parsed, Person)
    plain = client.chat.completions.create(**asked, response_format={"type": "json_object"})
    assert isinstance(json.loads(plain.choices[0].message.content or ""), dict)
    # max_tokens still cuts the document, as it cuts vLLM's, and the SDK says so.
    with pytest.raises(openai.LengthFinishReasonError) as cut:
        client.chat.completions.parse(**asked, response_format=Person, max_tokens=3)
    assert cut.value.completion.usage is not None
    assert cut.value.completion.usage.completion_tokens == 3


class GetWeather(BaseModel):
    city: str
    days: int


@pytest.mark.parametrize(
    "choice", ["auto", "required", {"type": "function", "function": {"name": "GetWeather"}}]
)
def test_tool_call_arguments_parse_into_the_functions_model(client: OpenAI, choice: Any) -> None:
    # The SDK loads a strict function's arguments into its model, as vLLM's guided decoding
    # keeps them to the parameters schema.
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages: Any = [{"role": "user", "content": "weather in paris"}]
    answer = client.chat.completions.parse(
        model=MODEL, messages=messages, tools=tools, tool_choice=choice
    )
    calls = answer.choices[0].message.tool_calls or []
    assert [type(call.function.parsed_arguments) for call in calls] == [GetWeather]


def test_suffix_is_refused_as_vllm_refuses_it(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="Once", max_tokens=3, suffix="the end")
    assert "suffix" in str(refused.value)


PROMPT = "The capital of France is Paris, and"


def test_echo_scores_a_prompt_as_evaluation_harnesses_do(client: OpenAI) -> None:
    """echo with max_tokens 0 and logprobs (how lm-evaluation-harness scores a prompt against
    an OpenAI-compatible server): the prompt comes back with a logprob per token, the first
    without one. max_tokens 0 without echo stays a 400."""
    scored = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    choice = scored.choices[0]
    assert choice.text == PROMPT
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert "".join(logprobs.tokens) == PROMPT
    assert logprobs.token_logprobs[0] is None
    assert all(lp is not None and lp < 0 for lp in logprobs.token_logprobs[1:])
    offsets = [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    assert logprobs.text_offset == offsets
    assert scored.usage is not None and scored.usage.completion_tokens == 1  # as vLLM counts
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert "max_tokens" in str(refused.value)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_puts_the_prompt_before_the_answer(client: OpenAI, stream: bool) -> None:
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, seed=3)
    asked: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "seed": 3}
    if stream:
        events = list(client.completions.create(**asked, echo=True, logprobs=0, stream=True))
        text = "".join(event.choices[0].text for event in events if event.choices)
        first = events[0].choices[0].logprobs
        tokens = [t for e in events if e.choices for t in (e.choices[0].logprobs.tokens or [])]
    else:
        answer = client.completions.create(**asked, echo=True, logprobs=0)
        text = answer.choices[0].text
        first = answer.choices[0].logprobs
        tokens = list(first.tokens or []) if first else []
    assert text == PROMPT + plain.choices[0].text
    assert first is not None and first.token_logprobs and first.token_logprobs[0] is None
    assert "".join(tokens).startswith(PROMPT)


def test_models_lists_public_name_and_pins(client: OpenAI) -> None:
    ids = [model.id for model in client.models.list()]
    assert ids == [MODEL, f"{MODEL}@nvfp4", f"{MODEL}@w4a16", f"{MODEL}@bf16"]
    for model_id in ids:  # the SDK's models.retrieve (it was a 404 for every id)
        assert client.models.retrieve(model_id).id == model_id
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve(f"{MODEL}@fp8")
    assert missing.value.code == "model_not_found"


def test_tool_call_round_trip(client: OpenAI) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages: list[dict[str, object]] = [{"role": "user", "content": "weather in Paris today"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)  # type: ignore[arg-type]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert "Paris" in json.loads(call.function.arguments)["city"]  # its parameters schema
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=tools)  # type: ignore[arg-type]
    assert second.choices[0].finish_reason in {"stop", "length"}
    assert second.choices[0].message.content


@pytest.mark.parametrize("how", ["suffix", "header"])
def test_pinning(client: OpenAI, ladder: Ladder, how: str) -> None:
    w4a16 = ladder.sims[1]
    before = w4a16.stats()["requests"]
    kwargs: dict[str, object] = (
        {"model": f"{MODEL}@w4a16"}
        if how == "suffix"
        else {"model": MODEL, "extra_headers": {"x-tiergate-tier": "w4a16"}}
    )
    raw = client.chat.completions.with_raw_response.create(
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        **kwargs,  # type: ignore[arg-type]
    )
    assert raw.headers["x-tiergate-tier"] == "w4a16"
    assert "x-tiergate-p" not in raw.headers  # pinned: the router decided nothing
    assert raw.parse().model == MODEL
    assert w4a16.stats()["requests"] == before + 1


def read_one_event_and_leave(port: int) -> None:
    """Opens a 2000-token stream, reads its first event and closes the connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2000,
        "stream": True,
    }
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(body),
        headers={"authorization": f"Bearer {API_KEY}", "content-type": "application/json"},
    )
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    conn.close()


def test_client_disconnect_cancels_upstream(ladder: Ladder) -> None:
    slow = Ladder.start(extra_args=("--time-scale", "50"))
    try:
        with GatewayThread(slow.settings()) as running:
            bf16 = slow.sims[2]
            read_one_event_and_leave(running.port)
            # The client closed the stream after one event; the engine must drop the sequence.
            deadline = time.monotonic() + 10
            while bf16.stats()["aborted"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            stats = bf16.stats()
            assert stats["aborted"] == 1
            assert stats["running"] == 0
            assert stats["generation_tokens"] < 2000
            # Counted once, as a departure: not as a 200, not as a stream that failed.
            labels = {"tenant": "default", "tier": "bf16"}
            assert running.settled_metric("tiergate_client_disconnects_total", labels, 1) == 1
            assert running.metric("tiergate_stream_errors_total", labels) == 0
            requests = {**labels, "endpoint": "chat"}
            assert running.metric("tiergate_requests_total", {**requests, "status": "499"}) == 1
            assert running.metric("tiergate_requests_total", {**requests, "status": "200"}) == 0
            # Its usage never came: it is in no cost counter, and counted as unmetered.
            assert running.metric("tiergate_unmetered_requests_total", labels) == 1
            assert running.metric("tiergate_estimated_cost_total", labels) == 0
    finally:
        slow.stop()


def released(gw: GatewayThread) -> None:
    """Waits until the gateway has seen the client leave and released its request: the
    departure is counted after the tenant's slot and tokens are given back (a fixed sleep
    let the next request be admitted against the left one's charge on a slow machine)."""
    labels = {"tenant": "default", "tier": "bf16"}
    assert gw.settled_metric("tiergate_client_disconnects_total", labels, 1) == 1


def test_leaving_a_stream_early_does_not_refund_its_tokens() -> None:
    """A stream left before its closing usage event has still cost tokens: the admission
    estimate stays charged against the tenant's tokens_per_minute (it was refunded whole,
    so a client could read most of a long stream, leave, and never be limited)."""
    slow = Ladder.start(extra_args=("--time-scale", "50"))
    try:
        data = slow.settings().model_dump(mode="json")
        data["tenants"][0]["limits"] = {"tokens_per_minute": 2500}
        data["tenants"][0]["api_keys"] = [API_KEY]
        from gateway.config import parse_settings

        with GatewayThread(parse_settings(data)) as running:
            read_one_event_and_leave(running.port)
            released(running)
            client = OpenAI(base_url=f"{running.url}/v1", api_key=API_KEY, max_retries=0)
            with pytest.raises(openai.RateLimitError):
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=600
                )
    finally:
        slow.stop()


def test_a_stream_left_early_is_charged_the_events_it_relayed() -> None:
    """Without max_tokens the admission estimate is small (256 completion tokens); a client
    that read 700 events and left before the usage event was charged only that, so it
    could read ten times its budget. It is now charged a token per relayed event."""
    ladder = Ladder.start(("nvfp4", "bf16"))
    try:
        data = ladder.settings().model_dump(mode="json")
        data["tenants"][0]["limits"] = {"tokens_per_minute": 1000}
        data["tenants"][0]["api_keys"] = [API_KEY]
        from gateway.config import parse_settings

        with GatewayThread(parse_settings(data)) as running:
            conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "write a long story"}],
                "stream": True,
                "ignore_eos": True,
            }
            headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
            conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
            response = conn.getresponse()
            assert response.status == 200
            events = 0
            while events < 700:
                if response.readline().startswith(b"data: "):
                    events += 1
            conn.close()
            released(running)
            client = OpenAI(base_url=f"{running.url}/v1", api_key=API_KEY, max_retries=0)
            with pytest.raises(openai.RateLimitError):  # 1000 - 700 read leaves < 400
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=400
                )
    finally:
        ladder.stop()


def test_every_answer_carries_the_gateways_request_id(client: OpenAI, gw: GatewayThread) -> None:
    """x-request-id on answers, streams and errors alike (the SDK's `_request_id`), sent
    upstream too: the engine builds the completion's id on it, as vLLM does."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    completion = client.chat.completions.create(**chat)  # type: ignore[call-overload]
    request_id = completion._request_id
    assert request_id is not None and re.fullmatch(r"req_[0-9a-f]{24}", request_id)
    assert completion.id == f"chatcmpl-{request_id}"
    stream = client.chat.completions.create(**chat, stream=True)  # type: ignore[call-overload]
    streamed = [chunk.id for chunk in stream]
    assert len(set(streamed)) == 1 and streamed[0].startswith("chatcmpl-req_")
    assert streamed[0] != completion.id  # one id per request
    text = client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert text.id == f"cmpl-{text._request_id}"
    # A client's own id is neither echoed nor passed on (see gateway/request_ids.py).
    chosen = {"x-request-id": "my-own-id"}
    reply = send("POST", f"{gw.url}/v1/chat/completions", chat, headers=chosen)
    assert reply.status == 200 and reply.headers["x-request-id"].startswith("req_")
    assert reply.json()["id"] == f"chatcmpl-{reply.headers['x-request-id']}"
    for status, body in ((400, {"model": MODEL}), (404, {**chat, "model": "nope"})):
        refused = send("POST", f"{gw.url}/v1/chat/completions", body)
        assert refused.status == status and refused.headers["x-request-id"].startswith("req_")
    with pytest.raises(openai.AuthenticationError) as caught:
        OpenAI(base_url=f"{gw.url}/v1", api_key="wrong", max_retries=0).chat.completions.create(
            **chat
        )
    assert caught.value.request_id is not None and caught.value.request_id.startswith("req_")
    models = client.models.with_raw_response.list()  # the other /v1 routes carry one too
    assert models.headers["x-request-id"].startswith("req_")
    for path in ("/v1/nothing-here", "/v1"):
        assert send("GET", f"{gw.url}{path}").headers["x-request-id"].startswith("req_")


def test_upstream_error_status_is_relayed_for_client_mistakes(client: OpenAI) -> None:
    # max_tokens beyond the context window: vLLM (and the simulator) answer 400.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10_000_000
        )
    assert "max_tokens" in str(caught.value)
    assert caught.value.request_id is not None and caught.value.request_id.startswith("req_")


def test_the_printed_sdk_example_runs_as_pasted(gw: GatewayThread) -> None:
    # `tiergate up` prints this; a user pastes the heredoc into bash as it stands.
    text = banner(gw.url, API_KEY, MODEL, ["nvfp4", "w4a16", "bf16"], python=sys.executable)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{sys.executable} - "))
    end = lines.index("EOF", start)
    pasted = "\n".join(lines[start : end + 1]) + "\n"
    done = subprocess.run(
        ["bash"], input=pasted, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) >= 1


def test_the_banner_says_how_to_get_the_sdk_when_it_is_missing() -> None:
    text = banner("http://h:1", "k", "m", ["a", "b"], python="/x/python", has_sdk=False)
    assert "/x/python -m pip install openai" in text
