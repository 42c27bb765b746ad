"""Simulated tool calls, with vLLM's rules for which function is called and how the answer
reports it (entrypoints/openai/chat_completion/serving.py).

A chat request with tools calls a function: the one `tool_choice` names, else the first
tool (`"auto"` only when the user spoke last, as a model answering a question would). The
generated tokens are the call's arguments, a value of the function's parameters schema. A
call cut by max_tokens or a stop string is what vLLM makes of cut output: a named call keeps
its partial arguments, an auto or required one no longer parses as a call and comes back as
text.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.sim import tokenizer
from gateway.sim.stops import StopCut, cut_at_stop
from gateway.sim.structured import schema_instance

ToolMode = Literal["auto", "required", "named"]


class ToolChoiceError(ValueError):
    """A `tool_choice` (or `tools`) vLLM refuses with a 400; `param` names the field."""

    def __init__(self, message: str, param: str = "tool_choice") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """The function a request calls and how `tool_choice` asked for it."""

    name: str
    mode: ToolMode
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallAnswer:
    """One choice's tool call (each choice has its own id, as in vLLM)."""

    call: dict[str, Any]
    mode: ToolMode

    @property
    def content(self) -> str | None:
        # vLLM builds named and required messages with `content or ""`, auto ones with None.
        return None if self.mode == "auto" else ""

    def finish_reason(self, engine_reason: str) -> str:
        """ "tool_calls" for auto (a parsed call) and required calls, the engine's reason for a
        named call."""
        if self.mode == "auto" or (self.mode == "required" and engine_reason == "stop"):
            return "tool_calls"
        return engine_reason


def reported_finish_reason(engine_reason: str, call: ToolCallAnswer | None) -> str:
    """The finish_reason a choice reports: the engine's, or vLLM's for a tool call."""
    return engine_reason if call is None else call.finish_reason(engine_reason)


def plan_call(request: dict[str, Any]) -> PlannedCall | None:
    """The call a chat request answers with, None for a text answer."""
    _refuse_tool_usage(request)
    tools = request.get("tools") or []
    choice = request.get("tool_choice")
    if not tools or choice == "none":
        return None
    last = request["messages"][-1]
    words = tokenizer.content_text(last.get("content")).split()[:6]
    if isinstance(choice, dict):
        name = _named_function(choice, tools)
        tool = next(tool for tool in tools if _function_name(tool) == name)
        return PlannedCall(name, "named", _arguments(tool, words))
    if choice != "required" and last.get("role") != "user":
        return None
    mode: ToolMode = "required" if choice == "required" else "auto"
    return PlannedCall(_function_name(tools[0]), mode, _arguments(tools[0], words))


def _arguments(tool: Any, words: list[str]) -> str:
    """A call's arguments: a value of the function's parameters schema (vLLM's guided
    decoding holds a required or named call to it, and SDKs parse calls into it), or the
    words under `query` for a function that declares no properties."""
    function = tool.get("function") if isinstance(tool, dict) else None
    parameters = function.get("parameters") if isinstance(function, dict) else None
    if isinstance(parameters, dict) and isinstance(parameters.get("properties"), dict):
        return orjson.dumps(schema_instance(parameters, words)).decode()
    return orjson.dumps({"query": " ".join(words)}).decode()


def answer_call(
    plan: PlannedCall, limit: int, stops: Iterable[str] = (), *, include_stop: bool = False
) -> tuple[StopCut, ToolCallAnswer | None]:
    """The tokens a choice generates for `plan` within `limit` tokens, up to a stop string
    (vLLM matches stop strings on the generated text before a tool parser reads it), and its
    call (None when the cut call no longer parses as one)."""
    texts = tokenizer.piece_texts(plan.arguments)
    cut = cut_at_stop(texts[:limit], stops, include_stop=include_stop)
    if (len(texts) > limit or cut.stop is not None) and plan.mode != "named":
        return cut, None
    call = {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": plan.name, "arguments": "".join(cut.texts)},
    }
    return cut, ToolCallAnswer(call, plan.mode)


def _refuse_tool_usage(request: dict[str, Any]) -> None:
    """vLLM's 400s for `tools` and `tool_choice` that do not go together (its request
    model's check_tool_usage): no empty tools, no tool_choice but "none" without tools, and
    only "auto", "required" or a named function as a string's alternatives."""
    tools, choice = request.get("tools"), request.get("tool_choice")
    if tools == []:
        raise ToolChoiceError(
            "`tools` must not be an empty array. "
            "Either provide at least one tool or omit the field entirely.",
            "tools",
        )
    if choice is None or choice == "none":
        return
    if tools is None:
        raise ToolChoiceError("When using `tool_choice`, `tools` must be set.")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise ToolChoiceError(
            f"Invalid value for `tool_choice`: {choice}! "
            'Only named tools, "none", "auto" or "required" are supported.'
        )


def _function_name(tool: Any) -> str:
    function = tool.get("function", {}) if isinstance(tool, dict) else {}
    return str(function.get("name", "tool"))


def _named_function(choice: dict[str, Any], tools: list[Any]) -> str:
    """The function a named `tool_choice` calls; vLLM's 400 when it names none of the tools."""
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ToolChoiceError(
            'Invalid `tool_choice`! Correct usage: `{"type": "function", '
            '"function": {"name": "my_function"}}`'
        )
    if name not in {_function_name(tool) for tool in tools}:
        raise ToolChoiceError(
            "The tool specified in `tool_choice` does not match any of the specified `tools`"
        )
    return name


__all__ = [
    "PlannedCall",
    "ToolCallAnswer",
    "ToolChoiceError",
    "ToolMode",
    "answer_call",
    "plan_call",
    "reported_finish_reason",
]
