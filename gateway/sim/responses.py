"""The simulator's `/v1/responses`: a Responses API request is answered as the chat it stands
for, then rendered as a Response object, or as its stream of typed events, in the shape
vLLM 0.32 serves them (stateless: `store` is ignored, as vLLM ignores it by default).

One answer per request (the Responses API has no `n`); a tool call is a `function_call`
output item. Stream events carry `event: <type>` lines and a `sequence_number`, and the
stream ends with `response.completed` (no `[DONE]`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.sim.streaming import StreamDropped

Send = Callable[[dict[str, Any]], Awaitable[None]]

__all__ = ["ResponseStream", "as_chat_request", "response_object"]


# -- request ----------------------------------------------------------------------------------
def as_chat_request(request: dict[str, Any]) -> dict[str, Any]:
    """The chat completions request a Responses API request stands for."""
    messages: list[dict[str, Any]] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    items = request["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    else:
        messages.extend(_chat_message(item) for item in items)
    chat: dict[str, Any] = {"model": request["model"], "messages": messages}
    for source, target in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("cache_salt", "cache_salt"),
    ):
        if request.get(source) is not None:
            chat[target] = request[source]
    response_format = _chat_response_format(request.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    tools = request.get("tools")
    if tools:
        chat["tools"] = [_chat_tool(tool) for tool in tools]
        choice = request.get("tool_choice")
        if isinstance(choice, dict):  # {"type": "function", "name": ...}
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif choice is not None:
            chat["tool_choice"] = choice
    return chat


def _chat_response_format(text: Any) -> dict[str, Any] | None:
    """The chat `response_format` a Responses `text.format` stands for: its json_schema
    format is flat (`name`, `schema`, `strict` beside `type`), chat's nests them."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    # Not checked here: chat's errors would name chat's fields (`response_format...`).
    name = fmt.get("name") if isinstance(fmt.get("name"), str) else "response"
    schema = fmt.get("schema") if isinstance(fmt.get("schema"), dict) else {}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _chat_message(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type")
    if kind == "function_call":
        call = {
            "id": item.get("call_id", ""),
            "type": "function",
            "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        return {
            "role": "tool",
            "tool_call_id": item.get("call_id", ""),
            "content": output if isinstance(output, str) else "",
        }
    content = item.get("content")
    if isinstance(content, list):  # input_text / output_text parts: their text
        content = [
            {"type": "text", "text": part["text"]}
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
    return {"role": item.get("role", "user"), "content": content}


def _chat_tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict):
        return {"type": "function", "function": {"name": "tool"}}
    function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
    return {"type": "function", "function": function}


# -- response ---------------------------------------------------------------------------------
def response_object(
    request: dict[str, Any],
    model: str,
    response_id: str,
    output: list[dict[str, Any]],
    *,
    status: str,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A Response object, field for field as vLLM 0.32 writes one (its null extensions
    included); `usage` in the chat shape (prompt/completion tokens) or None."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    tools = request.get("tools") or []
    return {
        "id": response_id,
        "created_at": int(time.time()),
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "metadata": request.get("metadata"),
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": _number_or(request.get("temperature"), 1.0),
        "tool_choice": request.get("tool_choice", "auto" if tools else "none"),
        "tools": tools,
        "top_p": _number_or(request.get("top_p"), 1.0),
        "background": False,
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": None,
        "previous_response_id": None,
        "prompt": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": status,
        "text": request.get("text"),
        "top_logprobs": None,
        "truncation": "disabled",
        "usage": None if usage is None else _responses_usage(usage),
        "user": request.get("user"),
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _number_or(value: Any, default: float) -> float:
    return default if value is None else float(value)


def _responses_usage(usage: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt + completion,
    }


def output_text(text: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "content": [output_text(text)] if status == "completed" else [],
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def function_call_item(item_id: str, call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function["arguments"],
        "status": "completed",
    }


def new_response_id(request_id: str | None) -> str:
    """vLLM's id: `resp_` on the caller's X-Request-Id, else a random one."""
    return "resp_" + (request_id or uuid.uuid4().hex)


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseStream:
    """Writes one streamed Response: created, in progress, the output item with its text
    deltas (or a function call whole), then completed with usage. `drop_after` cuts it (a
    fault), counted in events."""

    def __init__(
        self,
        send: Send,
        request: dict[str, Any],
        model: str,
        response_id: str,
        drop_after: int | None,
    ) -> None:
        self._send = send
        self._request = request
        self._model = model
        self._id = response_id
        self._drop_after = drop_after
        self._sequence = 0
        self._item_id = new_item_id("msg")
        self._text: list[str] = []
        self._opened = False

    def _response(self, status: str, output: list[dict[str, Any]], usage: Any = None) -> Any:
        return response_object(
            self._request, self._model, self._id, output, status=status, usage=usage
        )

    async def _event(self, kind: str, fields: dict[str, Any], *, last: bool = False) -> None:
        if self._drop_after is not None and self._sequence >= self._drop_after:
            raise StreamDropped("injected fault: stream dropped")
        event = {**fields, "sequence_number": self._sequence, "type": kind}
        data = b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
        await self._send({"type": "http.response.body", "body": data, "more_body": not last})
        self._sequence += 1

    async def start(self) -> None:
        await self._send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        await self._event("response.created", {"response": self._response("in_progress", [])})
        await self._event("response.in_progress", {"response": self._response("in_progress", [])})

    async def _open_message(self) -> None:
        self._opened = True
        item = message_item(self._item_id, "", status="in_progress")
        await self._event("response.output_item.added", {"output_index": 0, "item": item})
        part = output_text("", logprobs=[])
        await self._event("response.content_part.added", self._where() | {"part": part})

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._item_id, "output_index": 0, "content_index": 0}

    async def text(self, delta: str) -> None:
        """Generated text since the last call."""
        if not self._opened:
            await self._open_message()
        if delta:
            self._text.append(delta)
            await self._event(
                "response.output_text.delta", self._where() | {"delta": delta, "logprobs": []}
            )

    async def finish(
        self, call: dict[str, Any] | None, usage: dict[str, Any], *, complete: bool
    ) -> None:
        """Closes the output (a tool call goes out whole here) and completes the response."""
        if call is not None:
            item = function_call_item(new_item_id("fc"), call)
            added = {**item, "arguments": "", "status": "in_progress"}
            await self._event("response.output_item.added", {"output_index": 0, "item": added})
            await self._event(
                "response.function_call_arguments.done",
                {"item_id": item["id"], "output_index": 0, "arguments": item["arguments"]},
            )
            await self._event("response.output_item.done", {"output_index": 0, "item": item})
        else:
            if not self._opened:
                await self._open_message()
            text = "".join(self._text)
            item = message_item(self._item_id, text)
            part = item["content"][0]
            await self._event(
                "response.output_text.done", self._where() | {"text": text, "logprobs": []}
            )
            await self._event("response.content_part.done", self._where() | {"part": part})
            await self._event("response.output_item.done", {"output_index": 0, "item": item})
        status = "completed" if complete else "incomplete"
        done = self._response(status, [item], usage)
        await self._event("response.completed", {"response": done}, last=True)
