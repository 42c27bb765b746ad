"""The official OpenAI SDK through the gateway to real vLLM tiers.

Greedy decoding (temperature 0) of a fixed checkpoint is deterministic, so a streamed and a
non-streamed request for the same prompt must give the same text and the same usage, and
both must equal what the engine counted (its prompt and generation token counters).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI, Stream
from openai.types.chat import ChatCompletionChunk

from tests.helpers import GatewayThread
from tests.vllm.deployment import Deployment
from tests.vllm.support import (
    PUBLIC_MODEL,
    EngineScrape,
    client,
    first_event_paused,
    gateway_metric,
    gateway_settings,
    post_json,
    requests_in,
    resume_engine,
    settled_scrape,
    still_generating,
    wait_for,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MESSAGES = [
    {"role": "system", "content": "You answer in one short paragraph."},
    {"role": "user", "content": "Describe a quiet harbour town at dawn."},
]
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
CHAT_HANDLER = "/v1/chat/completions"  # the handler label of vLLM's http_requests_total


@pytest.fixture(scope="module")
def gw(deployment: Deployment) -> Iterator[GatewayThread]:
    with GatewayThread(gateway_settings(deployment)) as running:
        yield running


@pytest.fixture()
def sdk(gw: GatewayThread) -> OpenAI:
    return client(gw)


def chat_prompt_tokens(deployment: Deployment, tier: str) -> int:
    server = deployment[tier]
    body = {"model": server.served_model_name, "messages": MESSAGES}
    return int(post_json(f"{server.url}/tokenize", body)["count"])


def test_models_lists_the_public_name_and_pins(sdk: OpenAI) -> None:
    ids = [m.id for m in sdk.models.list()]
    assert ids == [PUBLIC_MODEL] + [f"{PUBLIC_MODEL}@{t}" for t in ("plain", "prefix", "spec")]


@pytest.mark.parametrize("tier", ["plain", "spec"])
def test_chat_stream_and_not_agree_with_the_engine(
    deployment: Deployment, sdk: OpenAI, tier: str
) -> None:
    server = deployment[tier]
    before = EngineScrape.of(server)
    raw = sdk.chat.completions.with_raw_response.create(
        model=f"{PUBLIC_MODEL}@{tier}", messages=MESSAGES, max_tokens=24, **GREEDY
    )
    plain = raw.parse()
    assert raw.headers["x-tiergate-tier"] == tier
    # The gateway's request id reached vLLM, which built the answer's id on it.
    assert plain.id == f"chatcmpl-{raw.headers['x-request-id']}"
    assert plain.model == PUBLIC_MODEL  # rewritten from the tier's served name
    assert plain.choices[0].finish_reason == "length"
    usage = plain.usage
    assert usage is not None and usage.completion_tokens == 24
    assert usage.prompt_tokens == chat_prompt_tokens(deployment, tier)
    middle = settled_scrape(server, before, 1)

    chunks = list(
        sdk.chat.completions.create(
            model=f"{PUBLIC_MODEL}@{tier}",
            messages=MESSAGES,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    after = settled_scrape(server, middle, 1)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert all(c.model == PUBLIC_MODEL for c in chunks)
    final = chunks[-1]
    assert final.choices == [] and final.usage is not None
    assert final.usage.model_dump() == usage.model_dump()
    for scrape, previous in ((middle, before), (after, middle)):
        assert scrape.delta(previous, "vllm:prompt_tokens_total") == usage.prompt_tokens
        assert scrape.delta(previous, "vllm:generation_tokens_total") == usage.completion_tokens
        assert scrape.delta(previous, "vllm:request_success_total", finished_reason="length") == 1


def test_responses_stream_and_not_agree_with_the_engine(
    deployment: Deployment, sdk: OpenAI, gw: GatewayThread
) -> None:
    """The Responses API through the gateway: the engine's answer with the public model
    name, the same text streamed and not (greedy), usage equal to the engine's counters, and
    the gateway's token counters moved by it."""
    server = deployment["plain"]
    labels = {"tenant": "default", "tier": "plain"}
    counted = gateway_metric(gw, "tiergate_completion_tokens_total", **labels)
    before = EngineScrape.of(server)
    request: dict[str, Any] = {
        "model": f"{PUBLIC_MODEL}@plain",
        "instructions": MESSAGES[0]["content"],
        "input": MESSAGES[1]["content"],
        "max_output_tokens": 24,
        "temperature": 0,
    }
    raw = sdk.responses.with_raw_response.create(**request)
    plain = raw.parse()
    assert raw.headers["x-tiergate-tier"] == "plain"
    assert plain.model == PUBLIC_MODEL  # rewritten from the tier's served name
    usage = plain.usage
    assert usage is not None and 0 < usage.output_tokens <= 24
    middle = settled_scrape(server, before, 1)
    events = list(sdk.responses.create(**request, stream=True))
    after = settled_scrape(server, middle, 1)
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.model == PUBLIC_MODEL
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == plain.output_text == final.response.output_text
    assert final.response.usage is not None
    assert final.response.usage.output_tokens == usage.output_tokens
    for scrape, previous in ((middle, before), (after, middle)):
        assert scrape.delta(previous, "vllm:prompt_tokens_total") == usage.input_tokens
        assert scrape.delta(previous, "vllm:generation_tokens_total") == usage.output_tokens
    expected = counted + 2 * usage.output_tokens
    wait_for(
        lambda: gateway_metric(gw, "tiergate_completion_tokens_total", **labels) == expected,
        f"the gateway's token counter at {expected}",
    )


def test_completions_stream_and_not(deployment: Deployment, sdk: OpenAI) -> None:
    server = deployment["spec"]
    prompt = "for item in items:\n    total += item.price\n" * 3
    before = EngineScrape.of(server)
    plain = sdk.completions.create(
        model=f"{PUBLIC_MODEL}@spec", prompt=prompt, max_tokens=40, **GREEDY
    )
    chunks = list(
        sdk.completions.create(
            model=f"{PUBLIC_MODEL}@spec",
            prompt=prompt,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    after = settled_scrape(server, before, 2)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    usage = chunks[-1].usage
    assert usage is not None and plain.usage is not None
    assert usage.model_dump() == plain.usage.model_dump() and usage.completion_tokens == 40
    tokenized = post_json(
        f"{server.url}/tokenize", {"model": server.served_model_name, "prompt": prompt}
    )
    assert usage.prompt_tokens == tokenized["count"]
    # Speculation emits several tokens per step; usage still counts each token once.
    assert after.delta(before, "vllm:generation_tokens_total") == 80
    assert after.delta(before, "vllm:spec_decode_num_accepted_tokens_total") > 0


def test_stream_without_usage_is_still_counted(
    deployment: Deployment, sdk: OpenAI, gw: GatewayThread
) -> None:
    server = deployment["plain"]
    labels = {"tenant": "default", "tier": "plain"}
    counted = gateway_metric(gw, "tiergate_completion_tokens_total", **labels)
    before = EngineScrape.of(server)
    chunks = list(
        sdk.chat.completions.create(
            model=f"{PUBLIC_MODEL}@plain", messages=MESSAGES, max_tokens=9, stream=True, **GREEDY
        )
    )
    # The gateway asked vLLM for usage itself; the client did not, so it sees none.
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)
    after = settled_scrape(server, before, 1)
    generated = after.delta(before, "vllm:generation_tokens_total")
    assert generated == 9
    wait_for(
        lambda: (
            gateway_metric(gw, "tiergate_completion_tokens_total", **labels) == counted + generated
        ),
        "the gateway to count the engine's tokens",
        timeout_s=5,
    )


@pytest.mark.parametrize("how", ["suffix", "header"])
def test_pinning_reaches_that_engine_only(deployment: Deployment, sdk: OpenAI, how: str) -> None:
    before = {name: EngineScrape.of(s) for name, s in deployment.servers.items()}
    pin: dict[str, Any] = (
        {"model": f"{PUBLIC_MODEL}@prefix"}
        if how == "suffix"
        else {"model": PUBLIC_MODEL, "extra_headers": {"x-tiergate-tier": "prefix"}}
    )
    raw = sdk.chat.completions.with_raw_response.create(
        messages=MESSAGES, max_tokens=4, temperature=0, **pin
    )
    assert raw.headers["x-tiergate-tier"] == "prefix"
    assert raw.parse().model == PUBLIC_MODEL
    settled_scrape(deployment["prefix"], before["prefix"], 1)
    for name, server in deployment.servers.items():
        done = EngineScrape.of(server).delta(before[name], "vllm:request_success_total")
        assert done == (1 if name == "prefix" else 0), name


def first_event(sdk: OpenAI, max_tokens: int) -> Stream[ChatCompletionChunk]:
    """A long greedy stream on `plain`, once the client has its first event."""
    stream = sdk.chat.completions.create(
        model=f"{PUBLIC_MODEL}@plain",
        messages=MESSAGES,
        max_tokens=max_tokens,
        stream=True,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert isinstance(stream, Stream)
    assert next(iter(stream)).choices
    return stream


def test_client_disconnect_aborts_the_request_in_vllm(
    deployment: Deployment, sdk: OpenAI, vllm_report: dict[str, Any]
) -> None:
    """The client leaves after the first event while the request is held in the paused
    engine, so the answer cannot finish first and nothing is generated meanwhile. vLLM's
    API server must then end the request, which aborts it in the engine; had the gateway
    kept the upstream stream open, it would not. vLLM 0.32 does not count client aborts in
    request_success (its output processor drops an aborted request without finishing its
    stats), so the abort shows as the request leaving the engine with its generation cut
    short and, resumed, never finishing."""
    server = deployment["plain"]
    max_tokens = 960  # with the prompt, just under max_model_len (1024)
    before = EngineScrape.of(server)
    stream = first_event_paused(server, lambda: first_event(sdk, max_tokens))
    try:
        paused = still_generating(server, before, max_tokens)
        stream.close()  # the client goes away after the first event
        closed = time.monotonic()

        def chat_ended() -> bool:
            now = EngineScrape.of(server)
            return now.delta(before, "http_requests_total", handler=CHAT_HANDLER) >= 1

        wait_for(chat_ended, "vLLM's API server to end the abandoned request", timeout_s=10)

        def left_the_engine() -> EngineScrape | None:
            now = EngineScrape.of(server)
            return now if requests_in(now) == 0 else None

        gone = wait_for(
            left_the_engine, "vLLM to drop the abandoned request", timeout_s=10, every_s=0.02
        )
        latency = time.monotonic() - closed
    finally:
        resume_engine(server)
    time.sleep(1.0)  # resumed: a request still held would generate again, and finish
    after = EngineScrape.of(server)
    generated = after.delta(before, "vllm:generation_tokens_total")
    vllm_report["client_disconnect"] = {
        "max_tokens": max_tokens,
        "generated_when_the_client_left": paused.delta(before, "vllm:generation_tokens_total"),
        "generated_before_abort": generated,
        "close_to_out_of_engine_s": round(latency, 3),
    }
    assert gone.delta(paused, "vllm:generation_tokens_total") == 0  # paused: no decoding
    assert generated == gone.delta(before, "vllm:generation_tokens_total")  # none resumed
    assert generated < max_tokens  # cut short: the generation never reached max_tokens
    assert after.delta(before, "vllm:request_success_total") == 0  # it never finished
    assert after.delta(before, "vllm:e2e_request_latency_seconds_count") == 0
