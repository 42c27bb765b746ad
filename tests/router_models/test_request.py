"""The request view reads every valid OpenAI shape and never raises on odd ones."""

from __future__ import annotations

import math
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from router_models.features import DENSE_NAMES, dense_features_of
from router_models.request import content_text, view_request

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def test_chat_view_reads_roles_system_and_last_user_turn() -> None:
    request = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}, {"id": "2"}]},
            {"role": "tool", "content": "42", "tool_call_id": "1"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "second"}, {"type": "image_url"}],
            },
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "json_object"},
        "max_tokens": 64,
        "temperature": 0.2,
        "n": 3,
    }
    view = view_request(request)
    assert view.text == "second"
    assert view.system_text == "You are terse."
    assert (view.n_messages, view.n_user, view.n_assistant) == (5, 2, 1)
    assert view.n_tool == 3  # two tool calls and one tool message
    assert view.n_media == 1
    assert view.has_tools and view.has_response_format
    assert (view.max_tokens, view.temperature, view.n_choices) == (64.0, 0.2, 3)
    assert view.is_chat


def test_a_responses_request_reads_as_the_chat_it_stands_for() -> None:
    responses = {
        "instructions": "You are terse.",
        "input": [
            {"role": "user", "content": "first question"},
            {"type": "function_call", "call_id": "1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "1", "output": "42"},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "second"}, {"type": "input_image"}],
            },
        ],
        "tools": [{"type": "function", "name": "f"}],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
        "max_output_tokens": 64,
        "temperature": 0.2,
    }
    chat = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "content": "42", "tool_call_id": "1"},
            {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "image"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "json_schema"},
        "max_tokens": 64,
        "temperature": 0.2,
    }
    assert view_request(responses) == view_request(chat)
    plain = view_request({"input": "just a question", "text": {"format": {"type": "text"}}})
    assert plain.text == "just a question" and plain.is_chat and not plain.has_response_format


def test_a_reasoning_models_turns_sent_back_read_as_the_chat_vllm_renders() -> None:
    """A stateless client sends a reasoning model's output items back: reasoning, call and
    answer items, which vLLM joins into one assistant message whose reasoning is no content.
    Each was a message, and the reasoning text (often the longest) counted as prompt text."""
    thinking = [{"type": "reasoning_text", "text": "long hidden thinking " * 100}]
    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "content": thinking}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    answer = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "42"}],
    }
    responses = {
        "input": [
            {"role": "user", "content": "what is it?"},
            thought,
            call,
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "the tool says 42"}],
            },
            thought,
            answer,
            {"role": "user", "content": "why?"},
        ]
    }
    chat = {
        "messages": [
            {"role": "user", "content": "what is it?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "content": "the tool says 42", "tool_call_id": "c1"},
            {"role": "assistant", "content": [{"type": "text", "text": "42"}]},
            {"role": "user", "content": "why?"},
        ]
    }
    assert view_request(responses) == view_request(chat)
    assert responses["input"][1] is thought and "reasoning" not in call  # the body is untouched


def test_a_long_run_of_function_calls_is_read_in_linear_time() -> None:
    """Each call of a run rebuilt the assistant turn's list of calls: 16,384 calls took
    0.65 s on the event loop, 50,000 about 6 s. Linear, they take a few tens of ms."""
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    started = time.perf_counter()
    view = view_request({"input": [call] * 50_000})
    assert time.perf_counter() - started < 2.0
    assert view.n_tool == 50_000 and view.n_assistant == 1


def test_a_responses_request_with_a_prompt_field_is_still_read_as_one() -> None:
    """The Responses API has a `prompt` of its own (a stored prompt's reference; vLLM
    accepts it, null or not): such a body was read as a completions request with no text."""
    question = {"input": [{"role": "user", "content": "why is the sky blue?"}], "tools": [{}]}
    expected = view_request(question)
    for prompt in (None, {"id": "pmpt_1", "version": "2"}):
        view = view_request({**question, "prompt": prompt})
        assert view == expected and view.text == "why is the sky blue?" and view.has_tools


def test_completion_prompt_shapes() -> None:
    assert view_request({"prompt": "hello"}).text == "hello"
    assert view_request({"prompt": ["a", "b"]}).text == "a\nb"
    tokens_only = view_request({"prompt": [1, 2, 3]})
    assert tokens_only.text == "" and tokens_only.prompt_tokens == 3
    nested = view_request({"prompt": [[1, 2], [3]]})
    assert nested.prompt_tokens == 3 and not nested.is_chat


def test_text_format_response_is_not_structured_output() -> None:
    assert not view_request(
        {"prompt": "x", "response_format": {"type": "text"}}
    ).has_response_format


def test_content_text_of_parts() -> None:
    assert content_text(None) == ("", 0)
    assert content_text([{"type": "text", "text": "a"}, "b", {"type": "input_audio"}]) == (
        "a\nb",
        1,
    )


def test_absent_sampling_parameters_are_nan_and_defaults() -> None:
    view = view_request({"messages": [{"role": "user", "content": "x"}], "n": True})
    assert math.isnan(view.max_tokens) and math.isnan(view.temperature)
    assert view.n_choices == 1


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "messages",
                "prompt",
                "tools",
                "n",
                "max_tokens",
                "temperature",
                "response_format",
                "input",
                "instructions",
                "text",
                "max_output_tokens",
                "x",
            ]
        ),
        json_values,
    )
)
def test_never_raises_and_features_are_finite(request: dict[str, Any]) -> None:
    features = dense_features_of(request)
    assert len(features) == len(DENSE_NAMES)
    assert all(math.isfinite(x) for x in features)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "tool_calls"]), json_values), max_size=5
    )
)
def test_odd_messages_never_raise(messages: list[dict[str, Any]]) -> None:
    features = dense_features_of({"messages": messages})
    assert all(math.isfinite(x) for x in features)


def test_integers_beyond_float_range_are_read_as_huge() -> None:
    """JSON integers are unbounded (a label file may hold a 400-digit max_tokens); float()
    of one raised OverflowError in the view and in the batch path."""
    from router_models.model import RouterModel, default_model_path

    model = RouterModel.load(default_model_path())
    huge = 10**400
    for extra in ({"max_tokens": huge}, {"temperature": -huge}, {"n": huge}):
        request = {"messages": [{"role": "user", "content": "hi"}], **extra}
        view = view_request(request)
        assert math.isfinite(view.max_tokens) or math.isnan(view.max_tokens)
        assert all(math.isfinite(x) for x in dense_features_of(request))
        one = model.predict_proba_one(request)
        batch = model.predict_proba([request])[0]
        assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(one, batch, strict=True))
