"""A vLLM-compatible OpenAI server backed by the simulated engine.

Same endpoints as `vllm serve` (/v1/chat/completions, /v1/completions, /v1/models,
/health, /metrics, /tokenize, /version), the same SSE framing (one event per engine step,
a usage-only last event when asked, `data: [DONE]`) and vLLM's error shape
(`{"error": {"message", "type": "BadRequestError", "param", "code": 400}}`).
Extra: GET/POST /sim/faults and GET /sim/stats for tests and demos.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from gateway.errors import TiergateError
from gateway.protocol import (
    EndpointKind,
    RequestLimits,
    completion_budget,
    parse_request,
)
from gateway.sim import textgen, tokenizer
from gateway.sim.engine import Engine, EngineConfig, Sequence, SequenceGroup
from gateway.sim.faults import Faults
from gateway.sim.logprobs import chat_logprobs, completion_logprobs
from gateway.sim.metrics import SimCollector, exposition
from gateway.sim.stops import cut_at_stop
from gateway.sim.streaming import SYSTEM_FINGERPRINT, StreamDropped, StreamWriter, response_id

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

_VLLM_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    413: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class SimError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": _VLLM_ERROR_TYPES.get(self.status, "BadRequestError"),
                    "param": self.param,
                    "code": self.status,
                }
            }
        )


@dataclass(slots=True)
class SimStats:
    requests: int = 0
    aborted: int = 0
    errors_injected: int = 0
    dropped_streams: int = 0
    rejected_saturated: int = 0


@dataclass(slots=True)
class Prepared:
    """A validated request turned into engine sequences."""

    request: dict[str, Any]
    kind: EndpointKind
    group: SequenceGroup
    prompt_tokens: int
    stream: bool
    include_usage: bool
    tool_call: dict[str, Any] | None
    top_logprobs: int | None  # None: no logprobs asked for


class SimServer:
    """The ASGI app of one simulated tier."""

    def __init__(
        self,
        config: EngineConfig,
        served_model_name: str,
        faults: Faults | None = None,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.served_model_name = served_model_name
        self.faults = faults or Faults()
        self.engine = Engine(config)
        self.collector = SimCollector(self.engine, served_model_name)
        self.stats = SimStats()
        self.limits = RequestLimits(
            max_body_bytes=64 * 1024 * 1024, max_json_depth=512, max_messages=100_000
        )
        self._random = random.Random(seed)
        self._created = int(time.time())
        self._routes = self._route_table()
        # Open client connections (kept by the uvicorn protocol wrapper in run.py), so that
        # refusing connections also drops the keep-alive ones a client already holds.
        self.connections: set[asyncio.BaseTransport] = set()

    # -- ASGI ------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        route = self._routes.get((scope["method"], scope["path"]))
        try:
            if route is None:
                raise SimError(404, f"Not Found: {scope['method']} {scope['path']}")
            await route(receive, send)
        except SimError as exc:
            await _respond(send, exc.status, exc.body(), b"application/json")

    def _route_table(self) -> dict[tuple[str, str], Callable[[Receive, Send], Awaitable[None]]]:
        async def chat(receive: Receive, send: Send) -> None:
            await self._generate("chat", await _read(receive), receive, send)

        async def completions(receive: Receive, send: Send) -> None:
            await self._generate("completions", await _read(receive), receive, send)

        async def models(receive: Receive, send: Send) -> None:
            await _json(send, 200, self._models())

        async def health(receive: Receive, send: Send) -> None:
            await _respond(send, 200, b"", b"text/plain")

        async def version(receive: Receive, send: Send) -> None:
            await _json(send, 200, {"version": "tiergate-sim"})

        async def metrics(receive: Receive, send: Send) -> None:
            await _respond(send, 200, exposition(self.collector), b"text/plain; version=0.0.4")

        async def tokenize(receive: Receive, send: Send) -> None:
            await _json(send, 200, self._tokenize(await _read(receive)))

        async def get_faults(receive: Receive, send: Send) -> None:
            await _json(send, 200, self.faults.model_dump())

        async def set_faults(receive: Receive, send: Send) -> None:
            self._update_faults(await _read(receive))
            await _json(send, 200, self.faults.model_dump())

        async def stats(receive: Receive, send: Send) -> None:
            await _json(send, 200, self._stats())

        return {
            ("POST", "/v1/chat/completions"): chat,
            ("POST", "/v1/completions"): completions,
            ("GET", "/v1/models"): models,
            ("GET", "/health"): health,
            ("GET", "/version"): version,
            ("GET", "/metrics"): metrics,
            ("POST", "/tokenize"): tokenize,
            ("GET", "/sim/faults"): get_faults,
            ("POST", "/sim/faults"): set_faults,
            ("GET", "/sim/stats"): stats,
        }

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.engine.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- generation ------------------------------------------------------------------------
    async def _generate(
        self, kind: EndpointKind, body: bytes, receive: Receive, send: Send
    ) -> None:
        self.stats.requests += 1
        prepared = self._prepare(kind, body)
        faults = self.faults
        if faults.error_rate and self._random.random() < faults.error_rate:
            self.stats.errors_injected += 1
            raise SimError(500, "Injected fault: internal server error.")
        if faults.max_waiting is not None and self.engine.num_waiting >= faults.max_waiting:
            self.stats.rejected_saturated += 1
            raise SimError(503, "The server is saturated; try again later.")
        if faults.added_latency_s:
            await asyncio.sleep(faults.added_latency_s)
        group = prepared.group
        arrival = time.perf_counter()
        self.engine.submit(group)
        watcher = asyncio.get_running_loop().create_task(self._watch(receive, group))
        try:
            if prepared.stream:
                await self._stream(prepared, send)
            else:
                while not group.done:
                    group.waiter.clear()
                    await group.waiter.wait()
                await _json(send, 200, self._full_response(prepared))
        finally:
            watcher.cancel()
        self.collector.e2e.observe(time.perf_counter() - arrival)
        first = min((s.first_token_at for s in group.sequences if s.first_token_at), default=None)
        if first is not None:
            self.collector.ttft.observe(max(0.0, first - group.sequences[0].arrival))

    async def _watch(self, receive: Receive, group: SequenceGroup) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not group.done:
            self.stats.aborted += 1
            self.engine.abort(group)
            group.waiter.set()

    def _prepare(self, kind: EndpointKind, body: bytes) -> Prepared:
        try:
            request = parse_request(kind, body, self.limits)
        except TiergateError as exc:
            raise SimError(exc.status, exc.message, exc.param) from None
        except ValidationError as exc:  # pragma: no cover - parse_request maps these
            raise SimError(400, str(exc)) from None
        if request["model"] != self.served_model_name:
            raise SimError(404, f"The model `{request['model']}` does not exist.", "model")
        _refuse_unsupported(kind, request)
        choices = request.get("n") or 1
        if kind == "chat":
            messages = request["messages"]
            text = "\n".join(tokenizer.content_text(m.get("content")) for m in messages)
            prompts = [(text, tokenizer.chat_prompt(messages))]
        else:
            prompts = [(prompt, prompt) for prompt in _prompt_texts(request["prompt"])]
            if not prompts:
                raise SimError(400, "You must pass at least one prompt")
        tool_call = self._tool_call(request) if kind == "chat" else None
        sequences: list[Sequence] = []
        prompt_tokens = 0
        # One request answers every prompt, each with n choices: choice index = prompt * n + i.
        for text, rendered in prompts:
            prompt_ids = tokenizer.encode(rendered)
            prompt_tokens += len(prompt_ids)
            limit = self._token_budget(kind, request, len(prompt_ids))
            for choice in range(choices):
                pieces, reason, stop = self._answer(request, text, choice, limit, tool_call)
                sequences.append(
                    Sequence(
                        prompt_ids=prompt_ids, answer=pieces, finish_reason=reason, stop_reason=stop
                    )
                )
        stream = request.get("stream") is True
        options = request.get("stream_options") or {}
        return Prepared(
            request=request,
            kind=kind,
            group=SequenceGroup(sequences),
            prompt_tokens=prompt_tokens,
            stream=stream,
            include_usage=bool(options.get("include_usage")),
            tool_call=tool_call,
            top_logprobs=_top_logprobs(kind, request),
        )

    def _answer(
        self,
        request: dict[str, Any],
        text: str,
        choice: int,
        limit: int,
        tool_call: dict[str, Any] | None,
    ) -> tuple[list[str], str, str | None]:
        """One choice's pieces, cut at a stop string or the token limit, why it ended and the
        stop string that ended it."""
        if tool_call is not None:  # the call is whole: stop strings do not cut it
            pieces = tokenizer.pieces(tool_call["function"]["arguments"])
            if len(pieces) > limit:
                return pieces[:limit], "length", None
            return pieces, "tool_calls", None
        pieces = textgen.answer(
            text,
            tokenizer.pieces(text),
            self.config.precision,
            request_seed=request.get("seed"),
            choice=choice,
            length=limit if request.get("ignore_eos") else None,
        )
        stops = request.get("stop")
        # Generated token by token: a stop string only counts inside the first `limit` tokens.
        cut, matched = cut_at_stop(
            pieces[:limit], [stops] if isinstance(stops, str) else stops or ()
        )
        if matched is None and len(pieces) > limit:
            return cut, "length", None
        return cut, "stop", matched

    def _token_budget(self, kind: EndpointKind, request: dict[str, Any], prompt_tokens: int) -> int:
        """The tokens an answer may have; vLLM's errors for a prompt or max_tokens too long."""
        max_model_len = self.config.max_model_len
        if prompt_tokens >= max_model_len:
            raise SimError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. "
                f"However, your request has {prompt_tokens} input tokens.",
            )
        _, max_tokens = completion_budget(kind, request)
        budget = max_model_len - prompt_tokens
        if max_tokens is not None and max_tokens > budget:
            raise SimError(
                400,
                f"'max_tokens' is too large: {max_tokens}. This model's maximum context length "
                f"is {max_model_len} tokens and your request has {prompt_tokens} input tokens.",
                "max_tokens",
            )
        return int(max_tokens) if max_tokens is not None else budget

    @staticmethod
    def _tool_call(request: dict[str, Any]) -> dict[str, Any] | None:
        """Calls the first tool when tools are offered and the user spoke last."""
        tools = request.get("tools") or []
        choice = request.get("tool_choice")
        last = request["messages"][-1]
        if not tools or choice == "none" or last.get("role") != "user":
            return None
        function = tools[0].get("function", {}) if isinstance(tools[0], dict) else {}
        words = tokenizer.content_text(last.get("content")).split()[:6]
        return {
            "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
            "type": "function",
            "function": {
                "name": str(function.get("name", "tool")),
                "arguments": orjson.dumps({"query": " ".join(words)}).decode(),
            },
        }

    def _usage(self, prepared: Prepared, *, details: bool = True) -> dict[str, Any]:
        completion = sum(seq.emitted for seq in prepared.group.sequences)
        usage: dict[str, Any] = {
            "prompt_tokens": prepared.prompt_tokens,
            "total_tokens": prepared.prompt_tokens + completion,
            "completion_tokens": completion,
        }
        if details:  # a whole answer's usage has them, a stream's usage event does not
            usage |= {"prompt_tokens_details": None, "completion_tokens_details": None}
        return usage

    def _full_response(self, prepared: Prepared) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        top = prepared.top_logprobs
        chat = prepared.kind == "chat"
        for index, seq in enumerate(prepared.group.sequences):
            pieces = seq.answer[: seq.emitted]
            text = textgen.detokenize(pieces)
            choice: dict[str, Any] = {"index": index}
            if chat:
                choice["message"] = self._message(text, prepared.tool_call)
                logprobs = None if top is None else chat_logprobs(pieces, 0, top)
            else:
                choice["text"] = text
                logprobs = None if top is None else completion_logprobs(pieces, 0, top, 0)
            choice |= {
                "logprobs": logprobs,
                "finish_reason": seq.finish_reason,
                "stop_reason": seq.stop_reason,
                "token_ids": None,
            }
            if not chat:
                choice |= {"prompt_logprobs": None, "prompt_token_ids": None}
            choices.append(choice | {"routed_experts": None})
        response = {
            "id": response_id(prepared.kind),
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.served_model_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": self._usage(prepared),
        }
        if chat:
            response |= {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
        return response | {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}

    @staticmethod
    def _message(text: str, tool_call: dict[str, Any] | None) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if tool_call is not None:
            message["content"] = None
            message["tool_calls"] = [tool_call]
        return message | {"reasoning": None}

    async def _stream(self, prepared: Prepared, send: Send) -> None:
        faults = self.faults
        drop = faults.drop_mid_stream and self._random.random() < faults.drop_mid_stream
        writer = StreamWriter(
            send,
            prepared.kind,
            self.served_model_name,
            prepared.tool_call,
            faults.drop_after_chunks if drop else None,
            top_logprobs=prepared.top_logprobs,
        )
        group = prepared.group
        try:
            await writer.start(len(group.sequences))
            announced = [False] * len(group.sequences)
            while True:
                group.waiter.clear()
                choices = []
                for index, seq in enumerate(group.sequences):
                    entry = writer.choice_for(index, seq, first=not announced[index])
                    if entry is not None:
                        announced[index] = True
                        choices.append(entry)
                if any(seq.aborted for seq in group.sequences):
                    return
                finished = group.done and all(s.taken == s.emitted for s in group.sequences)
                if choices:
                    await writer.emit(choices, last=finished and not prepared.include_usage)
                if finished:
                    break
                await group.waiter.wait()
            if prepared.include_usage:
                await writer.emit([], self._usage(prepared, details=False), last=True)
            await writer.done()
        except StreamDropped:
            self.stats.dropped_streams += 1
            self.engine.abort(group)
            raise

    # -- other endpoints -------------------------------------------------------------------
    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.served_model_name,
                    "object": "model",
                    "created": self._created,
                    "owned_by": "vllm",
                    "root": self.served_model_name,
                    "max_model_len": self.config.max_model_len,
                }
            ],
        }

    def _tokenize(self, body: bytes) -> dict[str, Any]:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise SimError(400, "Request body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise SimError(400, "Request body must be a JSON object.")
        if isinstance(data.get("messages"), list):
            text = tokenizer.chat_prompt(data["messages"])
        elif isinstance(data.get("prompt"), str):
            text = data["prompt"]
        else:
            raise SimError(400, "Send either 'prompt' (a string) or 'messages'.", "prompt")
        tokens = tokenizer.encode(text)
        return {"count": len(tokens), "max_model_len": self.config.max_model_len, "tokens": tokens}

    def _update_faults(self, body: bytes) -> None:
        try:
            changes = orjson.loads(body or b"{}")
            merged = {**self.faults.model_dump(), **changes}
            refusing = self.faults.refuse_connections
            self.faults = Faults.model_validate(merged)
        except (orjson.JSONDecodeError, ValidationError, TypeError) as exc:
            raise SimError(400, f"Invalid faults: {exc}") from None
        if self.faults.refuse_connections and not refusing:
            # After this response is out, drop every connection: the server "went away".
            asyncio.get_running_loop().call_later(0.05, self._drop_connections)

    def _drop_connections(self) -> None:
        for transport in list(self.connections):
            transport.close()

    def _stats(self) -> dict[str, Any]:
        counters = self.engine.counters
        return {
            "requests": self.stats.requests,
            "aborted": self.stats.aborted,
            "errors_injected": self.stats.errors_injected,
            "dropped_streams": self.stats.dropped_streams,
            "rejected_saturated": self.stats.rejected_saturated,
            "running": self.engine.num_running,
            "waiting": self.engine.num_waiting,
            "generation_tokens": counters.generation_tokens,
            "finished": dict(counters.finished),
            "precision": self.config.precision,
        }


def _prompt_texts(prompt: str | list[Any]) -> list[str]:
    """The prompts of a completions request: a string, a list of strings, one prompt of token
    ids, or a list of those (ids are read as text: the simulator has no vocabulary)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(item, int) for item in prompt):
        return [" ".join(map(str, prompt))]
    return [item if isinstance(item, str) else " ".join(map(str, item)) for item in prompt]


def _refuse_unsupported(kind: EndpointKind, request: dict[str, Any]) -> None:
    """vLLM's 400s for sampling it does not do, and one for `echo`, which vLLM does but the
    simulator does not (a 400 that says so beats an answer without the prompt). `best_of`,
    which vLLM 0.32 accepts, is accepted and has no effect: the answers are the n choices."""
    choices = request.get("n") or 1
    if choices > 1 and request.get("temperature") == 0:
        raise SimError(400, f"n must be 1 when using greedy sampling, got {choices}.")
    if kind != "completions":
        return
    if request.get("suffix") is not None:
        raise SimError(400, "suffix is not currently supported", "suffix")
    if request.get("echo"):
        raise SimError(400, "echo is not simulated by tiergate sim (vLLM supports it).", "echo")


def _top_logprobs(kind: EndpointKind, request: dict[str, Any]) -> int | None:
    """How many alternatives per token the request wants, None for no logprobs at all."""
    if kind == "completions":
        value = request.get("logprobs")
        return None if value is None else int(value)
    top = request.get("top_logprobs")
    if request.get("logprobs") is not True:
        if top:
            raise SimError(
                400, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )
        return None
    return int(top or 0)


async def _read(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _respond(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, data: Any) -> None:
    await _respond(send, status, orjson.dumps(data), b"application/json")


__all__ = ["SimServer", "StreamDropped"]
