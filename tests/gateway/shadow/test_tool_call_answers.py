"""Tool-call answers as the shadow judges read them."""

from typing import Any

import orjson

from gateway.observer.completions import completion_texts
from gateway.shadow.judges import JUDGES, judge

ORDER = list(JUDGES)


def _answer(name: str, arguments: str, content: str | None = None) -> str:
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }
    body = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    return completion_texts(orjson.dumps(body))[0]


def _verdict(candidate: str, reference: str) -> bool | None:
    found = judge(candidate, reference, {}, ORDER, deterministic=True)
    return None if found is None else found.adequate


def test_calls_to_different_functions_with_the_same_arguments_are_not_adequate() -> None:
    args = '{"account": "42"}'
    assert _verdict(_answer("delete_account", args), _answer("get_account", args)) is False


def test_calls_beside_empty_content_are_compared() -> None:
    paris, rome = '{"city": "Paris"}', '{"city": "Rome"}'
    assert _verdict(_answer("weather", rome, ""), _answer("weather", paris, "")) is False
    assert _verdict(_answer("weather", paris, ""), _answer("weather", paris, None)) is True


def test_a_streamed_call_reads_as_the_same_call_in_one_body() -> None:
    def event(delta: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"

    first = {"id": "c", "type": "function", "function": {"name": "weather", "arguments": ""}}
    stream = b"".join(
        [
            event({"role": "assistant", "content": ""}),
            event({"tool_calls": [{"index": 0, **first}]}),
            event({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
            event({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
            b"data: [DONE]\n\n",
        ]
    )
    assert completion_texts(stream) == [_answer("weather", '{"city": "Paris"}')]
