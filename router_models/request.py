"""What the router reads from an OpenAI request body: a flat, typed view, built in one pass.

Accepts `/v1/chat/completions` bodies (`messages`, content as a string, a list of parts or
None, assistant `tool_calls`, `tool` messages), `/v1/completions` bodies (`prompt` as a
string, a list of strings, a token array or a list of token arrays) and `/v1/responses` bodies
(`input` as a string or a list of items, `instructions`), read as the chat they stand for.
Never raises on any mapping: fields of unexpected types are read as absent, so a malformed
request is still routed (the gateway validates requests elsewhere).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

__all__ = ["CHARS_PER_TOKEN", "RequestView", "content_text", "view_request"]

# English text averages about four characters per BPE token; good enough to rank lengths.
CHARS_PER_TOKEN = 4.0


class RequestView(NamedTuple):
    """The parts of a request the features are computed from."""

    text: str  # last user turn (or the completion prompt): what the n-grams see
    system_text: str  # all system/developer messages, joined
    total_chars: int  # characters of text across every message or prompt
    prompt_tokens: float  # estimated prompt tokens (characters / 4, plus explicit token ids)
    n_messages: int
    n_user: int
    n_assistant: int
    n_tool: int  # tool/function messages plus assistant tool calls
    n_media: int  # non-text content parts (images, audio, files)
    has_tools: bool
    has_response_format: bool
    max_tokens: float  # NaN when absent
    temperature: float  # NaN when absent
    n_choices: int
    is_chat: bool


def content_text(content: Any) -> tuple[str, int]:
    """Text of a message `content` and the number of non-text parts in it."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    texts: list[str] = []
    media = 0
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping):
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
            elif part.get("type") not in (None, "text", "refusal"):
                media += 1
    return "\n".join(texts), media


def view_request(request: Mapping[str, Any], kind: str | None = None) -> RequestView:
    """One pass over the request body; never raises on a mapping. `kind` ("chat",
    "completions", "responses": the endpoint it came to) decides how it is read, as vLLM
    reads it: another endpoint's fields (a `messages` on completions) are ignored. Without
    it (label files), the body's own fields tell."""
    if kind is None:
        kind = _kind_of(request)
    if kind == "chat":
        messages = request.get("messages")
        return _view_chat(request, messages if isinstance(messages, list) else [])
    if kind == "responses":
        return _view_responses(request)
    return _view_completion(request)


def _kind_of(request: Mapping[str, Any]) -> str:
    if isinstance(request.get("messages"), list):
        return "chat"
    # A Responses body may carry `prompt` too (a stored prompt's reference, or null): only
    # a string or a list is a completions prompt.
    if "input" in request and not isinstance(request.get("prompt"), str | list):
        return "responses"
    return "completions"


def _view_responses(request: Mapping[str, Any]) -> RequestView:
    """A Responses API body as the chat it stands for: `instructions` is the system message,
    message items are messages, a function call an assistant tool call and its output a
    tool message; `max_output_tokens` and `text.format` play max_tokens and response_format."""
    messages: list[Any] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    items = request.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            _add_responses_item(messages, item)
    text = request.get("text")
    chat_fields = {
        "tools": request.get("tools"),
        "response_format": text.get("format") if isinstance(text, Mapping) else None,
        "max_tokens": request.get("max_output_tokens"),
        "temperature": request.get("temperature"),
    }
    return _view_chat(chat_fields, messages)


def _add_responses_item(messages: list[Any], item: Any) -> None:
    """Appends one input item as vLLM renders it into chat: a reasoning item, a function call
    or an assistant message that follows an assistant turn joins it (a reasoning model's
    turn comes back as reasoning, call and answer items: one assistant message). A reasoning
    item's text is the turn's `reasoning`, which the chat view does not read as content."""
    if not isinstance(item, Mapping):
        messages.append(item)  # skipped by _view_chat
        return
    kind = item.get("type")
    previous = messages[-1] if messages else None
    turn = previous if type(previous) is dict and previous.get("role") == "assistant" else None
    if kind == "function_call":
        if turn is not None:
            # The turn and its list are this view's own, so append in place: rebuilding the
            # list per call made a run of n calls cost n^2 (4 ms at the 1,024-item limit).
            turn.setdefault("tool_calls", []).append(item)
        else:
            messages.append({"role": "assistant", "tool_calls": [item]})
    elif kind == "reasoning":
        if turn is not None and "reasoning" not in turn:
            turn["reasoning"] = True
        else:
            messages.append({"role": "assistant", "reasoning": True})
    elif kind == "function_call_output":
        messages.append({"role": "tool", "content": item.get("output")})
    elif item.get("role") == "assistant":
        if turn is not None and turn.get("content") is None:
            turn["content"] = item.get("content")
        else:
            messages.append({"role": "assistant", "content": item.get("content")})
    else:
        messages.append(item)  # a message item: role and content (a string or parts)


def _view_chat(request: Mapping[str, Any], messages: list[Any]) -> RequestView:
    last_user = ""
    last_any = ""
    system: list[str] = []
    total = n_user = n_assistant = n_tool = n_media = 0
    for message in messages:
        # `type(...) is dict` first: JSON bodies are dicts, and an ABC isinstance costs ~0.3 us.
        if type(message) is not dict and not isinstance(message, Mapping):
            continue
        content = message.get("content")
        if type(content) is str:
            text = content
        else:
            text, media = content_text(content)
            n_media += media
        total += len(text)
        role = message.get("role")
        if role == "user":
            n_user += 1
            last_user = text
        elif role == "assistant":
            n_assistant += 1
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                n_tool += len(calls)
        elif role in ("system", "developer"):
            system.append(text)
        elif role in ("tool", "function"):
            n_tool += 1
        if text:
            last_any = text
    # Most optional fields are absent: test for None before calling a helper.
    tools, functions = request.get("tools"), request.get("functions")
    response_format = request.get("response_format")
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    temperature = request.get("temperature")
    n = request.get("n")
    # Positional: the hot path builds one of these per request.
    return RequestView(
        last_user or last_any,
        "\n".join(system) if system else "",
        total,
        total / CHARS_PER_TOKEN,
        len(messages),
        n_user,
        n_assistant,
        n_tool,
        n_media,
        (tools is not None and _non_empty(tools))
        or (functions is not None and _non_empty(functions)),
        response_format is not None and _structured(response_format),
        math.nan if max_tokens is None else _number(max_tokens),
        math.nan if temperature is None else _number(temperature),
        1 if n is None else _count(n),
        True,
    )


def _view_completion(request: Mapping[str, Any]) -> RequestView:
    prompt = request.get("prompt")
    token_ids = 0
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list):
        strings = [p for p in prompt if isinstance(p, str)]
        text = "\n".join(strings)
        for p in prompt:
            if isinstance(p, int):
                token_ids += 1
            elif isinstance(p, list):
                token_ids += len(p)
    else:
        text = ""
    return RequestView(
        text=text,
        system_text="",
        total_chars=len(text),
        prompt_tokens=len(text) / CHARS_PER_TOKEN + token_ids,
        n_messages=0,
        n_user=0,
        n_assistant=0,
        n_tool=0,
        n_media=0,
        has_tools=False,
        has_response_format=_structured(request.get("response_format")),
        max_tokens=_number(request.get("max_tokens")),
        temperature=_number(request.get("temperature")),
        n_choices=_count(request.get("n")),
        is_chat=False,
    )


def _non_empty(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0


def _structured(value: Any) -> bool:
    # {"type": "text"} is the default and asks for nothing.
    return isinstance(value, Mapping) and value.get("type", "text") != "text"


# JSON integers are unbounded; past these the value means "huge" alike, and a float holds it.
_LARGEST_NUMBER: Final = 1e300
_LARGEST_COUNT: Final = 1 << 20


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    try:
        number = float(value)
    except OverflowError:  # only an int can overflow a float; no cost on the usual path
        return _LARGEST_NUMBER if value > 0 else -_LARGEST_NUMBER
    return number if math.isfinite(number) else math.nan


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return 1
    return min(value, _LARGEST_COUNT)
