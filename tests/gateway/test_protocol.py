"""Request parsing: the fast path accepts only what the pydantic models accept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.errors import InvalidRequestError
from gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestLimits,
    _plainly_valid,
    parse_request,
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-5, 300)
    | st.floats(-3, 3)
    | st.floats(allow_nan=True)
    | st.text(max_size=5)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
messages = st.lists(
    st.dictionaries(
        st.sampled_from(["role", "content", "name"]),
        st.sampled_from(["user", "system", "wizard"]) | values,
        max_size=3,
    ),
    max_size=3,
)
field_names = [
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "user",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "tools",
    "stream_options",
    "extra_thing",
]
bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", ""]) | values},
    optional={
        "messages": messages | values,
        "prompt": st.text(max_size=5) | values,
        **dict.fromkeys(field_names, values),
    },
)


@settings(max_examples=500, deadline=None)
@given(bodies)
def test_fast_path_implies_the_models_accept(body: dict[str, Any]) -> None:
    for kind, model in (("chat", ChatCompletionRequest), ("completions", CompletionRequest)):
        if _plainly_valid(kind, body):  # type: ignore[arg-type]
            model.model_validate(body)  # must not raise


def test_common_bodies_take_the_fast_path() -> None:
    chat = {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "temperature": 0.2,
        "stream": True,
        "custom": {"x": 1},
    }
    assert _plainly_valid("chat", chat)
    assert _plainly_valid("completions", {"model": "m", "prompt": "once", "max_tokens": 5})
    assert not _plainly_valid("chat", {**chat, "tools": []})  # declared but complex: pydantic
    assert not _plainly_valid("chat", {**chat, "max_tokens": True})  # bool is not an int here


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "m", "messages": [{"role": ["x"], "content": "c"}]}', "messages.0.role"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "messages.0.content"),
        (b'{"model": "m", "messages": [{"role": "user"}], "n": 0}', "n"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stop": [1]}', "stop.0"),
        # Nested fields vLLM validates are validated here too, so they never reach a tier.
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}],'
            b' "tools": [{"type": "function", "function": 5}]}',
            "tools.0.function",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "hi"}],'
            b' "tools": [{"type": "function", "function": {"description": "no name"}}]}',
            "tools.0.function.name",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text",'
            b' "text": 5}]}]}',
            "messages.0.content.0.text",
        ),
        (
            b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c",'
            b' "type": "function", "function": {"name": "f", "arguments": {}}}]}]}',
            "messages.0.tool_calls.0.function.arguments",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "logit_bias": {"7": "up"}}',
            "logit_bias.7",
        ),
    ],
)
def test_rejections_name_the_parameter(body: bytes, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse_request("chat", body, RequestLimits())
    assert caught.value.param == param


def test_pydantic_still_guards_the_slow_path() -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": 5}]}
        )


@pytest.mark.parametrize(
    "messages_and_fields",
    [
        # Parts vLLM 0.32 accepts, bare ones without a type included (its "simple" forms).
        {"messages": [{"role": "user", "content": [{"image_url": "http://x/i.png"}]}]},
        {"messages": [{"role": "user", "content": [{"audio_url": "http://x/a.wav"}]}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "http://x/i.png"}},
                        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
                    ],
                }
            ]
        },
        # An assistant turn that called a tool, and the tool's answer.
        {
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "d",
                        "parameters": {"type": "object", "properties": {}},
                        "strict": True,
                    },
                },
                {"function": {"name": ""}},  # type defaults to function; vLLM takes any name
            ],
            "logit_bias": {"50256": -100, "11": 0.5},
        },
        # vLLM's models convert these, and its renderer skips a null text part.
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": None}, {"type": "text", "text": "x"}],
                }
            ],
            "logit_bias": {"50256": "-100"},
            "tools": [{"type": "function", "function": {"name": "f", "strict": "true"}}],
        },
    ],
)
def test_what_vllm_accepts_passes_untouched(messages_and_fields: dict[str, Any]) -> None:
    body = {"model": "m", **messages_and_fields}
    assert parse_request("chat", json.dumps(body).encode(), RequestLimits()) == body
