"""SSE framing of a simulated answer, event for event as vLLM frames it.

Field for field as vLLM 0.32 (tests/vllm/test_sim_fidelity.py compares the two), including
vLLM's own null extensions (token_ids, prompt_token_ids, ...), so that a client written
against the simulator meets no surprise against vLLM.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.protocol import EndpointKind
from gateway.sim import tokenizer
from gateway.sim.engine import Sequence
from gateway.sim.logprobs import chat_logprobs, completion_logprobs, echoed_logprobs
from gateway.sim.tools import ToolCallAnswer, reported_finish_reason

Send = Callable[[dict[str, Any]], Awaitable[None]]


class StreamDropped(Exception):
    """Raised inside a stream to cut the connection (fault injection)."""


def response_id(kind: EndpointKind, request_id: str | None = None) -> str:
    """vLLM's answer id: its kind's prefix on the caller's X-Request-Id, else a random one."""
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + (request_id or uuid.uuid4().hex)


SYSTEM_FINGERPRINT = "tiergate-sim"


def chat_delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": None,
        "token_ids": None,
    }


def text_choice(index: int, text: str) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }


class StreamWriter:
    """Writes the events of one streamed response; `drop_after` cuts it (a fault)."""

    def __init__(
        self,
        send: Send,
        kind: EndpointKind,
        model: str,
        tool_calls: list[ToolCallAnswer | None],
        drop_after: int | None,
        *,
        top_logprobs: int | None = None,
        echoes: list[str | None] | None = None,
        echo_only: bool = False,
        request_id: str | None = None,
    ) -> None:
        self._send = send
        # Completions with echo: a choice's first event carries its prompt (only the prompt
        # when echo_only), as vLLM sends it.
        self.echoes = echoes or []
        self.echo_only = echo_only
        self._echoed: set[int] = set()
        self.chat = kind == "chat"
        self.tool_calls = tool_calls
        self._announced: set[int] = set()  # choices that have had an entry with tokens
        self.drop_after = drop_after
        self.top_logprobs = top_logprobs
        self._text_offsets: dict[int, int] = {}  # per choice: characters streamed so far
        self.events = 0
        self._head = {
            "id": response_id(kind, request_id),
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    async def start(self, role_usages: list[dict[str, Any] | None]) -> None:
        """Starts the response; a chat stream then sends each choice its role event, with
        that choice's usage so far when it goes in every event."""
        await self._send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        if not self.chat:
            return
        for index, usage in enumerate(role_usages):
            delta = {"role": "assistant", "content": ""}
            role = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            await self.emit([role], self._running(usage), prompt_token_ids=None, prompt_text=None)

    async def emit_choice(
        self, entry: dict[str, Any], usage: dict[str, Any] | None, *, usage_follows: bool
    ) -> None:
        """One choice's event. vLLM names the system on a choice's last event, unless a
        usage event follows (that one is the last)."""
        last = entry["finish_reason"] is not None and not usage_follows
        await self.emit([entry], self._running(usage), last=last)

    def _running(self, usage: dict[str, Any] | None) -> dict[str, Any] | None:
        # vLLM's chat sets completion_tokens_details (null) in running usage; completions not.
        if usage is None or not self.chat:
            return usage
        return usage | {"completion_tokens_details": None}

    async def emit(
        self,
        choices: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        *,
        last: bool = False,
        **extra: Any,
    ) -> None:
        """One event; `last` marks the final one before [DONE], which names the system."""
        if self.drop_after is not None and self.events >= self.drop_after:
            raise StreamDropped("injected fault: stream dropped")
        chunk: dict[str, Any] = {**self._head, "choices": choices, **extra}
        if usage is not None:
            chunk["usage"] = usage
        if last:
            chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
        data = b"data: " + orjson.dumps(chunk) + b"\n\n"
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
        self.events += 1

    async def done(self) -> None:
        await self._send(
            {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}
        )

    def choice_for(self, index: int, seq: Sequence) -> dict[str, Any] | None:
        """The event entry for what `seq` produced since the last event, if anything."""
        start = seq.taken
        pieces = seq.take()
        entry: dict[str, Any] | None = None
        tool_call = self.tool_calls[index] if self.chat else None
        if pieces:
            first = index not in self._announced
            self._announced.add(index)
            if tool_call is not None:
                # vLLM's tool parsers emit a call once it is complete enough; the simulator
                # sends it whole with the first generated tokens.
                if first:
                    entry = chat_delta(index, {"tool_calls": [{"index": 0, **tool_call.call}]})
                elif self.top_logprobs is not None:  # the call went out whole; its tokens'
                    entry = chat_delta(index, {})  # logprobs still go out as they come
            elif self.chat:
                entry = chat_delta(index, {"content": seq.text(start, seq.taken)})
            else:
                entry = text_choice(index, seq.text(start, seq.taken))
            if entry is not None and self.top_logprobs is not None:
                spelled = seq.spelling(start, seq.taken)
                entry["logprobs"] = self._logprobs(index, pieces, start, spelled)
        if seq.done and not seq.aborted:
            if entry is None:
                entry = chat_delta(index, {}) if self.chat else text_choice(index, "")
            entry["finish_reason"] = reported_finish_reason(seq.finish_reason, tool_call)
            entry["stop_reason"] = seq.stop_reason
        echoed = self.echoes[index] if index < len(self.echoes) else None
        if entry is not None and echoed is not None and index not in self._echoed:
            self._echoed.add(index)
            self._echo(entry, echoed)
        return entry

    def _echo(self, entry: dict[str, Any], prompt: str) -> None:
        """Puts the prompt in front of a choice's first event (in its place when echo_only),
        with the prompt's token ids, as vLLM's first echo event has them."""
        entry["text"] = prompt if self.echo_only else prompt + entry["text"]
        entry["prompt_token_ids"] = tokenizer.encode(prompt)
        if self.top_logprobs is not None:
            generated = None if self.echo_only else entry["logprobs"]
            entry["logprobs"] = echoed_logprobs(prompt, self.top_logprobs, generated)
        self._text_offsets[entry["index"]] = len(entry["text"])

    def _logprobs(
        self, index: int, pieces: list[str], start: int, spelled: list[str] | None
    ) -> dict[str, Any]:
        top = self.top_logprobs or 0
        if self.chat:
            return chat_logprobs(pieces, start, top, spelled)
        offset = self._text_offsets.get(index, 0)
        logprobs = completion_logprobs(pieces, start, top, offset, spelled)
        self._text_offsets[index] = offset + sum(len(token) for token in logprobs["tokens"])
        return logprobs


__all__ = [
    "SYSTEM_FINGERPRINT",
    "StreamDropped",
    "StreamWriter",
    "chat_delta",
    "response_id",
    "text_choice",
]
