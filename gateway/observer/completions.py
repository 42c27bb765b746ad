"""Text of an OpenAI completion, from the bytes the gateway relayed (JSON or SSE).

Used off the hot path on sampled requests: the regime observer tokenizes it for n-gram
replay, shadow evaluation compares it with the reference tier's answer.
"""

from __future__ import annotations

from typing import Any

import orjson


def _choice_text(choice: dict[str, Any]) -> str:
    if "text" in choice and isinstance(choice["text"], str):
        return choice["text"]
    for key in ("message", "delta"):
        part = choice.get(key)
        if isinstance(part, dict):
            content = part.get("content")
            text = content if isinstance(content, str) else ""
            calls = part.get("tool_calls")
            if isinstance(calls, list):
                # Content may sit beside the calls (often ""), and a call is its function's
                # name and arguments: two calls that differ only in the name are different
                # answers. A stream sends the name once, then the arguments in pieces.
                text += "".join(_tool_call_text(call) for call in calls)
            return text
    return ""


def _tool_call_text(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return ""
    return f"{function.get('name') or ''}{function.get('arguments') or ''}"


def completion_texts(body: bytes) -> list[str]:
    """One text per choice index; empty when the body is not a completion."""
    texts: dict[int, list[str]] = {}
    if body.lstrip().startswith(b"data:"):
        for event in body.split(b"\n\n"):
            data = event.strip().removeprefix(b"data:").strip()
            if not data or data == b"[DONE]":
                continue
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            _collect(chunk, texts)
    else:
        try:
            _collect(orjson.loads(body), texts)
        except orjson.JSONDecodeError:
            return []
    return ["".join(parts) for _, parts in sorted(texts.items())]


def _collect(payload: Any, texts: dict[int, list[str]]) -> None:
    if not isinstance(payload, dict):
        return
    for choice in payload.get("choices") or ():
        if isinstance(choice, dict):
            index = choice.get("index", 0)
            texts.setdefault(index if isinstance(index, int) else 0, []).append(
                _choice_text(choice)
            )


__all__ = ["completion_texts"]
