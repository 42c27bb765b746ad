"""Request parsing: the fast path accepts only what the pydantic models accept."""

from __future__ import annotations

import gc
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.errors import InvalidRequestError
from gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EndpointKind,
    RequestLimits,
    _plainly_valid,
    nesting_depth,
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


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_TRICKY_TEXT = st.text(alphabet='[]{}"\\ab:,é\n', max_size=12)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | _TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY_TEXT, inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES, st.booleans())
def test_the_byte_scan_reads_the_nesting_depth_of_any_json(value: Any, spaced: bool) -> None:
    """Brackets, quotes and backslashes inside strings never count; both serialisations."""
    text = json.dumps(value, ensure_ascii=False) if spaced else orjson.dumps(value).decode()
    assert nesting_depth(text.encode()) == _depth(value)


def test_a_body_too_large_to_walk_is_judged_by_the_byte_scan() -> None:
    """Past the walk's budget the depth is read from the bytes: the verdict is the walk's
    (a million tiny lists held the event loop 2 s in the walk alone)."""
    wide = [[i] for i in range(20_000)]  # past the budget
    deep: Any = "[[{"
    for _ in range(40):
        deep = [deep]
    limits = RequestLimits()
    for extra, refused in ((wide, False), ([*wide, deep], True), ([*wide, "[" * 100], False)):
        body = orjson.dumps({"model": "m", "prompt": "hi", "extra": extra})
        if refused:
            with pytest.raises(InvalidRequestError, match="deeper than 32"):
                parse_request("completions", body, limits)
        else:
            assert parse_request("completions", body, limits)["extra"] == extra


def test_the_parse_sets_off_no_garbage_collection() -> None:
    """Each list a body holds counted towards a collection that walked the growing heap: a
    million tiny lists held the event loop 0.4-0.9 s in orjson's parse, 0.1 s without them.
    Parsed JSON holds no cycle for a collection to find."""
    body = orjson.dumps({"model": "m", "prompt": "hi", "extra": [[]] * 300_000})
    collections: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        parse_request("completions", body, RequestLimits())
    finally:
        gc.callbacks.remove(count)
    assert gc.isenabled()
    assert len(collections) < 10, f"{len(collections)} collections during the parse"


def _parts(kind: str, n: int) -> list[dict[str, Any]]:
    part = {"type": "text" if kind == "chat" else "input_text", "text": "a"}
    return [{"role": "user", "content": [part] * n}]


@pytest.mark.parametrize(
    ("kind", "field", "build", "limit", "what"),
    [
        ("completions", "prompt", lambda n: [[1]] * n, 4096, "prompts"),
        ("completions", "prompt", lambda n: ["a"] * n, 4096, "prompts"),
        ("completions", "prompt", lambda n: [1] * n, 262_144, "token ids"),
        ("completions", "prompt", lambda n: [[1] * n], 262_144, "token ids"),
        ("chat", "messages", lambda n: _parts("chat", n), 4096, "content parts"),
        ("responses", "input", lambda n: _parts("responses", n), 4096, "content parts"),
    ],
)
def test_lists_whose_validation_would_hold_the_loop_are_refused_first(
    kind: Any, field: str, build: Any, limit: int, what: str
) -> None:
    """300,000 content parts held the event loop 1.6 s in validation; a million prompts
    2.9 s. A list at the limit is accepted."""
    limits = RequestLimits()
    body = orjson.dumps({"model": "m", field: build(limit + 1)})
    with pytest.raises(InvalidRequestError, match=f"Too many {what}: {limit + 1}") as refused:
        parse_request(kind, body, limits, 8 << 20)
    # Named as pydantic's errors are (messages.0.content.0.text): the one list too long.
    assert refused.value.param == ("prompt" if field == "prompt" else f"{field}.0.content")
    parse_request(kind, orjson.dumps({"model": "m", field: build(limit)}), limits, 8 << 20)


_TOOL = {"type": "function", "function": {"name": "f"}}
_CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("kind", "build", "param"),
    [
        # Parts spread over messages, each message under max_list_items: 0.6 s at 4 MiB.
        ("chat", lambda n: {"messages": _parts("chat", n // 4) * 4}, "messages"),
        ("responses", lambda n: {"input": _parts("responses", n // 4) * 4}, "input"),
        # Tools and tool calls had no bound at all: 85,000 tools held the loop 0.8 s.
        (
            "chat",
            lambda n: {"messages": [{"role": "user", "content": "hi"}], "tools": [_TOOL] * n},
            "tools",
        ),
        (
            "responses",
            lambda n: {"input": "hi", "tools": [{"type": "function", "name": "f"}] * n},
            "tools",
        ),
        (
            "chat",
            lambda n: {"messages": [{"role": "assistant", "tool_calls": [_CALL] * n}]},
            "messages",
        ),
        (
            "chat",
            lambda n: {
                "messages": [
                    *_parts("chat", n // 4) * 2,
                    {"role": "assistant", "tool_calls": [_CALL] * (n // 4)},
                ],
                "tools": [_TOOL] * (n - n // 4 * 3),
            },
            "messages",  # three quarters of the items
        ),
    ],
)
def test_validated_items_are_bounded_over_the_whole_request(
    kind: Any, build: Any, param: str
) -> None:
    """Refused naming the list that holds most of the items (the param was null)."""
    limits = RequestLimits()
    limit = limits.max_validated_items
    body = orjson.dumps({"model": "m", **build(limit + 4)})
    with pytest.raises(
        InvalidRequestError, match=f"together: {limit + 4}; the limit is {limit}"
    ) as refused:
        parse_request(kind, body, limits, 8 << 20)
    assert refused.value.param == param
    parse_request(kind, orjson.dumps({"model": "m", **build(limit)}), limits, 8 << 20)


SEEDED_REQUESTS: dict[EndpointKind, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "responses": {"model": "m", "input": "hi"},
}


@pytest.mark.parametrize("kind", SEEDED_REQUESTS)
@pytest.mark.parametrize("seed", [2**63, 2**64, -(2**63) - 1])
def test_a_seed_outside_vllms_signed_64_bit_range_is_refused_naming_it(
    kind: EndpointKind, seed: int
) -> None:
    """vLLM bounds the seed to int64 on all three endpoints; the gateway relayed 2**63 (and,
    on /v1/responses, any seed) for the tier to refuse."""
    body = json.dumps({**SEEDED_REQUESTS[kind], "seed": seed}).encode()
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(kind, body, RequestLimits())
    assert caught.value.param == "seed"


@pytest.mark.parametrize("kind", SEEDED_REQUESTS)
@pytest.mark.parametrize("seed", [-(2**63), -1, 2**63 - 1])
def test_a_seed_inside_the_signed_64_bit_range_passes(kind: EndpointKind, seed: int) -> None:
    body = json.dumps({**SEEDED_REQUESTS[kind], "seed": seed}).encode()
    assert parse_request(kind, body, RequestLimits())["seed"] == seed


@pytest.mark.parametrize(
    ("kind", "field", "extra"),
    [("chat", "top_logprobs", {"logprobs": True}), ("completions", "logprobs", {})],
)
def test_logprobs_counts_are_bounded_by_the_engine_not_the_gateway(
    kind: EndpointKind, field: str, extra: dict[str, Any]
) -> None:
    """vLLM takes any count up to its --max-logprobs (which may be raised, or -1 for no
    limit) and -1 for the whole vocabulary: the gateway refused 21 and -1 itself."""
    base = {**SEEDED_REQUESTS[kind], **extra}
    for count in (-1, 0, 21, 500):
        body = json.dumps({**base, field: count}).encode()
        assert parse_request(kind, body, RequestLimits())[field] == count
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(kind, json.dumps({**base, field: -2}).encode(), RequestLimits())
    assert caught.value.param == field


@pytest.mark.parametrize(("prompt", "param"), [([-1], "prompt.0"), ([[1], [2, -3]], "prompt.1.1")])
def test_a_negative_token_id_is_refused_naming_it(prompt: list[Any], param: str) -> None:
    """vLLM's schema takes token ids >= 0. The message is about the id, not about the
    string the union's first member wanted there."""
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    with pytest.raises(InvalidRequestError) as caught:
        parse_request("completions", body, RequestLimits())
    assert caught.value.param == param
    assert caught.value.message.endswith("Input should be greater than or equal to 0.")


@pytest.mark.parametrize("kind", ["chat", "completions"])
@pytest.mark.parametrize("field", ["stop", "logit_bias"])
def test_stop_strings_and_logit_biases_are_bounded(kind: EndpointKind, field: str) -> None:
    """Checked one by one, on the fast path too: 975,000 stop strings cost 108 ms of the
    event loop and 290,000 biases 160 ms, in bodies under the size limit."""
    limits = RequestLimits(max_list_items=100)

    def entries(n: int) -> Any:
        return ["x"] * n if field == "stop" else {str(token): 1 for token in range(n)}

    base = dict(SEEDED_REQUESTS[kind])
    assert parse_request(kind, json.dumps({**base, field: entries(100)}).encode(), limits)
    with pytest.raises(InvalidRequestError) as caught:
        parse_request(kind, json.dumps({**base, field: entries(101)}).encode(), limits)
    assert caught.value.param == field and "101" in caught.value.message
