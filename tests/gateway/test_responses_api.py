"""`/v1/responses` (the Responses API) through the gateway, with the official OpenAI SDK:
routed, pinned, metered and relayed like chat; stateful requests refused."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, send

TOOL = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
}


@pytest.fixture()
def client(gw: GatewayThread) -> OpenAI:
    return OpenAI(base_url=f"{gw.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


def tokens_of(gw: GatewayThread, tier: str) -> float:
    return gw.metric("tiergate_completion_tokens_total", {"tenant": "default", "tier": tier})


def test_a_response_is_routed_and_metered(client: OpenAI, gw: GatewayThread) -> None:
    before = tokens_of(gw, "bf16")
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Write a haiku about the sea", max_output_tokens=8
    )
    response = raw.parse()
    assert raw.headers["x-tiergate-tier"] == "bf16"
    assert raw.headers["x-request-id"].startswith("req_")
    assert response.model == MODEL  # rewritten from the tier's served name
    assert len(response.output_text.split()) == 8
    assert response.status == "incomplete"  # cut by max_output_tokens
    assert response.usage is not None and response.usage.output_tokens == 8
    assert (
        gw.metric_at_least(
            "tiergate_completion_tokens_total", {"tenant": "default", "tier": "bf16"}, before + 8
        )
        == before + 8
    )
    requests = {"tenant": "default", "tier": "bf16", "endpoint": "responses", "status": "200"}
    assert gw.metric("tiergate_requests_total", requests) >= 1


def test_a_streamed_response_relays_every_event_and_counts_its_usage(
    client: OpenAI, gw: GatewayThread
) -> None:
    before = tokens_of(gw, "nvfp4")
    events = list(
        client.responses.create(
            model=f"{MODEL}@nvfp4",
            instructions="Answer briefly.",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "hello there"}]}],
            max_output_tokens=12,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == deltas and len(deltas.split()) == 12
    assert final.model == MODEL and final.usage is not None and final.usage.output_tokens == 12
    settled = gw.metric_at_least(
        "tiergate_completion_tokens_total", {"tenant": "default", "tier": "nvfp4"}, before + 12
    )
    assert settled == before + 12
    unmetered = {"tenant": "default", "tier": "nvfp4"}
    assert gw.metric("tiergate_unmetered_requests_total", unmetered) == 0


def test_a_tool_call_round_trip(client: OpenAI) -> None:
    first = client.responses.create(
        model=MODEL,
        input="weather in Paris?",
        tools=[TOOL],
        tool_choice="required",  # type: ignore[list-item]
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "lookup"
    second = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[TOOL],  # type: ignore[list-item]
        max_output_tokens=6,
    )
    assert second.output[0].type == "message" and second.output_text


@pytest.mark.parametrize("field", ["previous_response_id", "conversation"])
def test_state_kept_by_one_engine_is_refused(client: OpenAI, field: str) -> None:
    extra: dict[str, Any] = {field: "resp_123" if field == "previous_response_id" else "conv_1"}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="and then?", **extra)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == field and error["code"] == "unsupported_parameter"
    assert "whole conversation" in error["message"]


def test_a_background_response_is_refused(client: OpenAI, gw: GatewayThread) -> None:
    """vLLM would answer "queued" and generate on, unmetered and outside the tenant's
    concurrency, into a store only a GET to that one engine reads (the gateway routes none);
    it does so even with store false. background false is an ordinary request."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="a long essay", background=True, store=False)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "background" and error["code"] == "unsupported_parameter"
    as_text = send(
        "POST", f"{gw.url}/v1/responses", {"model": MODEL, "input": "hi", "background": "true"}
    )
    assert as_text.status == 400 and as_text.json()["error"]["param"] == "background"
    served = client.responses.create(model=MODEL, input="hi", background=False, max_output_tokens=3)
    assert served.usage is not None and served.usage.output_tokens == 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": 5}, "input"),
        ({"model": MODEL, "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": MODEL, "input": "hi", "temperature": 3}, "temperature"),
        ({"model": MODEL, "input": [{"role": "user", "content": "x"}] * 1025}, "input"),
    ],
)
def test_malformed_requests_are_400_in_openai_shape(
    gw: GatewayThread, body: dict[str, Any], param: str
) -> None:
    reply = send("POST", f"{gw.url}/v1/responses", body)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == param


def test_a_tenant_cap_bounds_max_output_tokens(ladder: Ladder) -> None:
    settings = ladder.settings()
    tenant = settings.tenants[0]
    capped = tenant.model_copy(
        update={"limits": tenant.limits.model_copy(update={"max_tokens": 5})}
    )
    with GatewayThread(settings.model_copy(update={"tenants": [capped]})) as gw:
        client = OpenAI(base_url=f"{gw.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model=MODEL, input="hi", max_output_tokens=50)
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["param"] == "max_output_tokens"
        unbounded = client.responses.create(model=MODEL, input="tell me a long story")
        assert unbounded.usage is not None and unbounded.usage.output_tokens == 5
        # Built-in tools loop in the engine, a fresh max_output_tokens per turn: refused
        # under a cap; function tools are the client's own turns and pass.
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(
                model=MODEL,
                input="look it up",
                tools=[{"type": "web_search_preview"}, TOOL],  # type: ignore[list-item]
            )
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["param"] == "tools"
        assert "web_search_preview" in caught.value.body["message"]
        called = client.responses.create(
            model=MODEL,
            input="look it up",
            tools=[TOOL],
            tool_choice="required",  # type: ignore[list-item]
        )
        assert called.output  # served (its 5-token call is cut to text by the cap)
