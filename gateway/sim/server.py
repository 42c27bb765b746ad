"""A vLLM-compatible OpenAI server backed by the simulated engine.

Same endpoints as `vllm serve` (/v1/chat/completions, /v1/completions, /v1/models,
/health, /metrics, /tokenize, /version), the same SSE framing (one event per choice and engine
step, a usage-only last event when asked, `data: [DONE]`) and vLLM's error shape
(`{"error": {"message", "type": "BadRequestError", "param", "code": 400}}`).
Extra: GET/POST /sim/faults and GET /sim/stats for tests and demos.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

import orjson
from pydantic import TypeAdapter, ValidationError

from gateway.errors import InvalidRequestError, TiergateError
from gateway.protocol import (
    ChatMessage,
    EndpointKind,
    RequestLimits,
    completion_budget,
    parse_request,
)
from gateway.sim import responses as sim_responses
from gateway.sim import structured, textgen, tokenizer
from gateway.sim.engine import Engine, EngineConfig, Sequence, SequenceGroup
from gateway.sim.faults import Faults
from gateway.sim.logprobs import (
    chat_logprobs,
    completion_logprobs,
    echoed_logprobs,
    prompt_logprob_map,
)
from gateway.sim.metrics import SimCollector, exposition
from gateway.sim.stops import StopCut, cut_at_stop, spaced_texts
from gateway.sim.streaming import SYSTEM_FINGERPRINT, StreamDropped, StreamWriter, response_id
from gateway.sim.tools import (
    PlannedCall,
    ToolCallAnswer,
    ToolChoiceError,
    answer_call,
    plan_call,
    reported_finish_reason,
)
from gateway.tenants.cache_salt import client_salt

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Scope = dict[str, Any]
Route = Callable[[Scope, Receive, Send], Awaitable[None]]

# The paths vLLM's --api-key guards; /health, /metrics and /tokenize stay open.
GUARDED_PREFIXES: Final = ("/v1", "/v2", "/inference", "/cohere")
# vLLM's _SAMPLING_EPS: a temperature below it is greedy sampling.
GREEDY_TEMPERATURE_EPS: Final = 1e-5
# vLLM's --max-logprobs default: more alternatives per token (-1 is the whole vocabulary)
# is the engine's 400, not the request schema's.
MAX_LOGPROBS: Final = 20
_VLLM_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    413: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def _has_empty_text_prompt(prompt: Any) -> bool:
    """An empty string among the prompts (vLLM's renderer refuses it, naming the field)."""
    return prompt == "" or (isinstance(prompt, list) and "" in prompt)


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
    continuous_usage: bool  # usage in every event too (needs include_usage, as in vLLM)
    tool_calls: list[ToolCallAnswer | None]  # per choice
    top_logprobs: int | None  # None: no logprobs asked for
    # Completions with echo: per choice, the prompt the answer starts with (else None).
    # echo_only (max_tokens 0): the prompt alone; the one token generated is not returned.
    echoes: list[str | None]
    echo_only: bool
    request_id: str | None = None  # the caller's X-Request-Id
    # A Responses API request as sent; `request` is then the chat it stands for.
    responses_request: dict[str, Any] | None = None


class SimServer:
    """The ASGI app of one simulated tier."""

    def __init__(
        self,
        config: EngineConfig,
        served_model_name: str,
        faults: Faults | None = None,
        seed: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.config = config
        # As vLLM's --api-key: paths under GUARDED_PREFIXES need `Authorization: Bearer <key>`.
        self._api_key = api_key.encode() if api_key else None  # empty: none, as in vLLM
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
        if self._api_key is not None and not self._authorized(scope, self._api_key):
            await _json(send, 401, {"error": "Unauthorized"})  # vLLM's answer, verbatim
            return
        route = self._routes.get((scope["method"], scope["path"]))
        if route is None:
            await self._unrouted(scope, send)
            return
        try:
            await route(scope, receive, send)
        except SimError as exc:
            await _respond(send, exc.status, exc.body(), b"application/json")

    async def _unrouted(self, scope: Scope, send: Send) -> None:
        """FastAPI's own answer, which vLLM's error handlers leave as it is (they catch
        fastapi's HTTPException, and the router raises Starlette's): a bare `detail`, and
        405 for a path served under another method."""
        if any(path == scope["path"] for _, path in self._routes):
            await _json(send, 405, {"detail": "Method Not Allowed"})
        else:
            await _json(send, 404, {"detail": "Not Found"})

    @staticmethod
    def _authorized(scope: dict[str, Any], api_key: bytes) -> bool:
        if scope["method"] == "OPTIONS" or not scope["path"].startswith(GUARDED_PREFIXES):
            return True
        presented = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, key = presented.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(key, api_key)

    def _route_table(self) -> dict[tuple[str, str], Route]:
        async def chat(scope: Scope, receive: Receive, send: Send) -> None:
            await self._generate("chat", await _read(receive), receive, send, scope)

        async def completions(scope: Scope, receive: Receive, send: Send) -> None:
            await self._generate("completions", await _read(receive), receive, send, scope)

        async def responses(scope: Scope, receive: Receive, send: Send) -> None:
            await self._generate("responses", await _read(receive), receive, send, scope)

        async def models(scope: Scope, receive: Receive, send: Send) -> None:
            await _json(send, 200, self._models())

        async def health(scope: Scope, receive: Receive, send: Send) -> None:
            await _respond(send, 200, b"", b"text/plain")

        async def version(scope: Scope, receive: Receive, send: Send) -> None:
            await _json(send, 200, {"version": "tiergate-sim"})

        async def metrics(scope: Scope, receive: Receive, send: Send) -> None:
            await _respond(send, 200, exposition(self.collector), b"text/plain; version=0.0.4")

        async def tokenize(scope: Scope, receive: Receive, send: Send) -> None:
            await _json(send, 200, self._tokenize(await _read(receive)))

        async def get_faults(scope: Scope, receive: Receive, send: Send) -> None:
            await _json(send, 200, self.faults.model_dump())

        async def set_faults(scope: Scope, receive: Receive, send: Send) -> None:
            self._update_faults(await _read(receive))
            await _json(send, 200, self.faults.model_dump())

        async def stats(scope: Scope, receive: Receive, send: Send) -> None:
            await _json(send, 200, self._stats())

        return {
            ("POST", "/v1/chat/completions"): chat,
            ("POST", "/v1/completions"): completions,
            ("POST", "/v1/responses"): responses,
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
        self, kind: EndpointKind, body: bytes, receive: Receive, send: Send, scope: Scope
    ) -> None:
        self.stats.requests += 1
        prepared = self._prepare(kind, body)
        # vLLM builds the answer's id on the caller's X-Request-Id when there is one.
        prepared.request_id = next(
            (v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-request-id"),
            None,
        )
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
            raise SimError(
                404,
                f"The model `{request['model']}` does not exist. "
                f"Valid aliases: {self.served_model_name}.",
                "model",
            )
        responses_request = None
        if kind == "responses":  # answered as the chat it stands for, rendered back later
            _refuse_responses_tool_choice(request)
            responses_request, request = request, sim_responses.as_chat_request(request)
        prepared = self._prepare_parsed("chat" if kind == "responses" else kind, request)
        prepared.kind, prepared.responses_request = kind, responses_request
        return prepared

    def _prepare_parsed(self, kind: EndpointKind, request: dict[str, Any]) -> Prepared:
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
            if _has_empty_text_prompt(request["prompt"]):
                raise SimError(
                    400,
                    "Either prompt or prompt_embeds must be provided and non-empty. "
                    "(parameter=prompt)",
                    "prompt",
                )
            if any(not prompt for prompt, _ in prompts):
                # vLLM's input processor refuses a prompt of no tokens (ours: no text).
                raise SimError(400, "The decoder prompt cannot be empty")
        plan = _plan_call(request) if kind == "chat" else None
        echo = kind == "completions" and request.get("echo") is True
        echo_only = echo and request.get("max_tokens") == 0
        sequences: list[Sequence] = []
        tool_calls: list[ToolCallAnswer | None] = []
        echoes: list[str | None] = []
        prompt_tokens = 0
        # One request answers every prompt, each with n choices: choice index = prompt * n + i.
        for text, rendered in prompts:
            prompt_ids = tokenizer.encode(rendered)
            prompt_tokens += len(prompt_ids)
            # vLLM generates one token for an echo of max_tokens 0 (counted in usage).
            limit = 1 if echo_only else self._token_budget(kind, request, len(prompt_ids))
            _refuse_min_tokens_above(limit, request.get("min_tokens"))
            echoes += [text if echo else None] * choices
            for choice in range(choices):
                if plan is None:
                    sequences.append(self._answer(request, prompt_ids, text, choice, limit))
                    tool_calls.append(None)
                else:
                    sequence, call = _call_answer(plan, prompt_ids, limit, request)
                    sequences.append(sequence)
                    tool_calls.append(call)
        salt = _cache_salt(request)
        for sequence in sequences:
            sequence.cache_salt = salt
        options = request.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        return Prepared(
            request=request,
            kind=kind,
            group=SequenceGroup(sequences),
            prompt_tokens=prompt_tokens,
            stream=request.get("stream") is True,
            include_usage=include_usage,
            continuous_usage=include_usage and bool(options.get("continuous_usage_stats")),
            tool_calls=tool_calls,
            top_logprobs=_top_logprobs(kind, request),
            echoes=echoes,
            echo_only=echo_only,
        )

    def _answer(
        self, request: dict[str, Any], prompt_ids: list[int], text: str, choice: int, limit: int
    ) -> Sequence:
        """One choice's text answer, up to the token that completed a stop string or to the
        token limit."""

        def generate(length: int | None) -> list[str]:
            return textgen.answer(
                text,
                tokenizer.pieces(text),
                self.config.precision,
                request_seed=request.get("seed"),
                choice=choice,
                length=length,
            )

        pieces = generate(limit if request.get("ignore_eos") else None)
        # vLLM holds the end of sequence back until min_tokens tokens are out.
        min_tokens = min(request.get("min_tokens") or 0, limit)
        if len(pieces) < min_tokens:
            pieces = generate(min_tokens)
        document = structured.json_answer(request.get("response_format"), pieces)
        if document is not None:
            return _spelled_answer(document, prompt_ids, limit, request)
        # Generated token by token: a stop string only counts inside the first `limit` tokens.
        cut = cut_at_stop(
            spaced_texts(pieces[:limit]),
            _stop_strings(request),
            include_stop=request.get("include_stop_str_in_output") is True,
            min_tokens=min_tokens,
        )
        # An answer of `limit` tokens or more ends at the limit: its end-of-sequence token
        # would have been one more (so `ignore_eos` answers end with "length", as in vLLM).
        reason = "length" if cut.stop is None and len(pieces) >= limit else "stop"
        return Sequence(
            prompt_ids=prompt_ids,
            answer=pieces[: cut.tokens],
            finish_reason=reason,
            stop_reason=cut.stop,
            texts=cut.texts,
        )

    def _token_budget(self, kind: EndpointKind, request: dict[str, Any], prompt_tokens: int) -> int:
        """The tokens an answer may have; vLLM's errors for a prompt or max_tokens too long.
        As vLLM 0.32 (get_max_tokens), a max_tokens within max_model_len but beyond what the
        prompt leaves is cut to the rest of the context (the answer then ends at "length");
        only one above max_model_len itself is refused."""
        max_model_len = self.config.max_model_len
        field, max_tokens = completion_budget(kind, request)
        if max_tokens is not None and max_tokens > max_model_len:
            raise SimError(
                400,
                f"{field}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                f"Please request fewer output tokens. (parameter={field}, value={max_tokens})",
                field,
            )
        if prompt_tokens >= max_model_len:
            raise SimError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. "
                f"However, your request has {prompt_tokens} input tokens.",
            )
        budget = max_model_len - prompt_tokens
        return budget if max_tokens is None else min(int(max_tokens), budget)

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
        if prepared.responses_request is not None:
            return self._response_object(prepared, prepared.responses_request)
        choices: list[dict[str, Any]] = []
        top = prepared.top_logprobs
        chat = prepared.kind == "chat"
        for index, seq in enumerate(prepared.group.sequences):
            pieces = seq.answer[: seq.emitted]
            spelled = seq.spelling(0, seq.emitted)
            text = seq.text(0, seq.emitted)
            tool_call = prepared.tool_calls[index]
            echoed = prepared.echoes[index]
            choice: dict[str, Any] = {"index": index}
            if chat:
                choice["message"] = self._message(text, tool_call)
                logprobs = None if top is None else chat_logprobs(pieces, 0, top, spelled)
            else:
                logprobs = None if top is None else completion_logprobs(pieces, 0, top, 0, spelled)
                if echoed is not None:
                    text = echoed if prepared.echo_only else echoed + text
                    if top is not None:
                        generated = None if prepared.echo_only else logprobs
                        logprobs = echoed_logprobs(echoed, top, generated)
                choice["text"] = text
            choice |= {
                "logprobs": logprobs,
                "finish_reason": reported_finish_reason(seq.finish_reason, tool_call),
                "stop_reason": seq.stop_reason,
                "token_ids": None,
            }
            if not chat:
                prompt_logprobs = (
                    None if echoed is None or top is None else prompt_logprob_map(echoed, top)
                )
                choice |= {"prompt_logprobs": prompt_logprobs, "prompt_token_ids": None}
            choices.append(choice | {"routed_experts": None})
        response = {
            "id": response_id(prepared.kind, prepared.request_id),
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

    def _response_object(self, prepared: Prepared, request: dict[str, Any]) -> dict[str, Any]:
        seq, call = prepared.group.sequences[0], prepared.tool_calls[0]
        if call is not None:
            output = sim_responses.function_call_item(sim_responses.new_item_id("fc"), call.call)
        else:
            text = seq.text(0, seq.emitted)
            output = sim_responses.message_item(sim_responses.new_item_id("msg"), text)
        return sim_responses.response_object(
            request,
            self.served_model_name,
            sim_responses.new_response_id(prepared.request_id),
            [output],
            status=_response_status(seq, call),
            usage=self._usage(prepared, details=False),
        )

    @staticmethod
    def _message(text: str, tool_call: ToolCallAnswer | None) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if tool_call is not None:
            message["content"] = tool_call.content
            message["tool_calls"] = [tool_call.call]
        return message | {"reasoning": None}

    @staticmethod
    def _role_usages(prepared: Prepared) -> list[dict[str, Any] | None]:
        """Per choice, the usage of its role event: none generated yet."""
        if not prepared.continuous_usage:
            return [None] * len(prepared.group.sequences)
        return [_running_usage(seq, generated=0) for seq in prepared.group.sequences]

    def _drops_stream(self) -> bool:
        faults = self.faults
        return bool(faults.drop_mid_stream) and self._random.random() < faults.drop_mid_stream

    async def _stream(self, prepared: Prepared, send: Send) -> None:
        if prepared.responses_request is not None:
            await self._stream_response(prepared, prepared.responses_request, send)
            return
        faults = self.faults
        drop = self._drops_stream()
        writer = StreamWriter(
            send,
            prepared.kind,
            self.served_model_name,
            prepared.tool_calls,
            faults.drop_after_chunks if drop else None,
            top_logprobs=prepared.top_logprobs,
            echoes=prepared.echoes,
            request_id=prepared.request_id,
            echo_only=prepared.echo_only,
        )
        group = prepared.group
        try:
            await writer.start(self._role_usages(prepared))
            while True:
                group.waiter.clear()
                # One event per choice with news, as vLLM sends one per engine output.
                for index, seq in enumerate(group.sequences):
                    entry = writer.choice_for(index, seq)
                    if entry is not None:
                        usage = _running_usage(seq) if prepared.continuous_usage else None
                        await writer.emit_choice(entry, usage, usage_follows=prepared.include_usage)
                if any(seq.aborted for seq in group.sequences):
                    return
                if group.done and all(s.taken == s.emitted for s in group.sequences):
                    break
                await group.waiter.wait()
            if prepared.include_usage:
                await writer.emit([], self._usage(prepared, details=False), last=True)
            await writer.done()
        except StreamDropped:
            self.stats.dropped_streams += 1
            self.engine.abort(group)
            raise

    async def _stream_response(
        self, prepared: Prepared, request: dict[str, Any], send: Send
    ) -> None:
        group = prepared.group
        seq, call = group.sequences[0], prepared.tool_calls[0]
        stream = sim_responses.ResponseStream(
            send,
            request,
            self.served_model_name,
            sim_responses.new_response_id(prepared.request_id),
            self.faults.drop_after_chunks if self._drops_stream() else None,
        )
        try:
            await stream.start()
            while True:
                group.waiter.clear()
                start = seq.taken
                if seq.take() and call is None:  # a call goes out whole at the end
                    await stream.text(seq.text(start, seq.taken))
                if seq.aborted:
                    return
                if group.done and seq.taken == seq.emitted:
                    break
                await group.waiter.wait()
            usage = self._usage(prepared, details=False)
            complete = _response_status(seq, call) == "completed"
            await stream.finish(None if call is None else call.call, usage, complete=complete)
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
                    "parent": None,
                    "max_model_len": self.config.max_model_len,
                    "permission": [_model_permission()],
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
        tokens = tokenizer.encode(_text_to_tokenize(data))
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


_CHAT_MESSAGES: Final = TypeAdapter(list[ChatMessage])


def _text_to_tokenize(data: dict[str, Any]) -> str:
    """The text a /tokenize body asks about: its chat rendered, or its prompt. A malformed
    body is a 400, as vLLM's request models make it."""
    if data.get("messages") is not None:
        try:
            _CHAT_MESSAGES.validate_python(data["messages"])
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            param = ".".join(map(str, ("messages", *first["loc"])))
            raise SimError(400, f"Invalid value for '{param}': {first['msg']}.", param) from None
        return tokenizer.chat_prompt(data["messages"])
    if isinstance(data.get("prompt"), str):
        return str(data["prompt"])
    raise SimError(400, "Send either 'prompt' (a string) or 'messages' (a list).", "prompt")


def _response_status(seq: Sequence, call: ToolCallAnswer | None) -> str:
    """A Response cut by max_output_tokens is "incomplete"; a whole tool call completes it."""
    return "incomplete" if call is None and seq.finish_reason == "length" else "completed"


def _running_usage(seq: Sequence, generated: int | None = None) -> dict[str, Any]:
    """A choice's usage in its own events (`continuous_usage_stats`): its prompt and the
    tokens it has streamed so far."""
    prompt = len(seq.prompt_ids)
    completion = seq.taken if generated is None else generated
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def _plan_call(request: dict[str, Any]) -> PlannedCall | None:
    try:
        return plan_call(request)
    except ToolChoiceError as exc:
        raise SimError(400, str(exc), exc.param) from None


def _call_answer(
    plan: PlannedCall, prompt_ids: list[int], limit: int, request: dict[str, Any]
) -> tuple[Sequence, ToolCallAnswer | None]:
    """One choice answering with `plan`'s call: its tokens are the call's arguments, cut by
    max_tokens or a stop string as any output is."""
    cut, call = answer_call(
        plan,
        limit,
        _stop_strings(request),
        include_stop=request.get("include_stop_str_in_output") is True,
    )
    return _spelled_sequence(plan.arguments, cut, prompt_ids), call


def _spelled_answer(
    text: str, prompt_ids: list[int], limit: int, request: dict[str, Any]
) -> Sequence:
    """One choice whose tokens spell `text` (JSON a grammar allowed), cut by max_tokens or a
    stop string as any output is."""
    cut = cut_at_stop(
        tokenizer.piece_texts(text)[:limit],
        _stop_strings(request),
        include_stop=request.get("include_stop_str_in_output") is True,
    )
    return _spelled_sequence(text, cut, prompt_ids)


def _spelled_sequence(text: str, cut: StopCut, prompt_ids: list[int]) -> Sequence:
    """The choice whose tokens spell `text` as far as `cut` left them: "length" when the
    token limit, not a stop string, ended it short."""
    pieces, spelled = tokenizer.pieces(text), tokenizer.piece_texts(text)
    reason = "length" if cut.stop is None and cut.tokens < len(pieces) else "stop"
    return Sequence(
        prompt_ids=prompt_ids,
        answer=pieces[: cut.tokens],
        finish_reason=reason,
        stop_reason=cut.stop,
        texts=cut.texts,
        spelled=spelled[: cut.tokens],
    )


def _cache_salt(request: dict[str, Any]) -> str | None:
    """The request's prefix-cache namespace, refused as vLLM refuses a malformed one."""
    try:
        return client_salt(request.get("cache_salt"))
    except InvalidRequestError as exc:
        raise SimError(400, exc.message, param="cache_salt") from None


def _stop_strings(request: dict[str, Any]) -> list[str]:
    stops = request.get("stop")
    return [stops] if isinstance(stops, str) else list(stops or ())


def _prompt_texts(prompt: str | list[Any]) -> list[str]:
    """The prompts of a completions request: a string, a list of strings, one prompt of token
    ids, or a list of those (ids are read as text: the simulator has no vocabulary)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(item, int) for item in prompt):
        return [" ".join(map(str, prompt))]
    return [item if isinstance(item, str) else " ".join(map(str, item)) for item in prompt]


def _refuse_unsupported(kind: EndpointKind, request: dict[str, Any]) -> None:
    """vLLM's 400s for sampling it does not do. `best_of`, which vLLM 0.32 accepts, is
    accepted and has no effect: the answers are the n choices."""
    if request.get("stream_options") and not request.get("stream"):
        raise SimError(
            400, "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    stops = request.get("stop")
    if stops == "" or (isinstance(stops, list) and "" in stops):
        # vLLM's SamplingParams refuses it: an empty string would match at once.
        raise SimError(400, "stop cannot contain an empty string.")
    _refuse_sampling_out_of_range(request)
    _refuse_prompt_logprobs(request)
    choices = request.get("n") or 1
    if choices > 1 and _is_greedy(request.get("temperature")):
        raise SimError(400, f"n must be 1 when using greedy sampling, got {choices}.")
    response_format = request.get("response_format")
    if response_format is not None and (
        not isinstance(response_format, dict)
        or response_format.get("type") not in _RESPONSE_FORMATS
    ):
        raise SimError(
            400,
            f"response_format type must be one of {', '.join(_RESPONSE_FORMATS)}",
            "response_format",
        )
    if response_format is not None and response_format.get("type") == "json_schema":
        _refuse_schemaless_json_schema(response_format.get("json_schema"))
    if (
        kind == "chat"
        and request.get("continue_final_message")
        and request.get("add_generation_prompt", True)
    ):
        # vLLM's check_generation_prompt; add_generation_prompt is true unless turned off
        raise SimError(
            400,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )
    if kind != "completions":
        return
    if request.get("suffix") is not None:
        raise SimError(400, "suffix is not currently supported", "suffix")
    for ids in _token_id_prompts(request["prompt"]):
        # vLLM's renderer (a negative id is already its schema's 400, and parse_request's).
        if max(ids) >= tokenizer.VOCAB_SIZE:
            raise SimError(400, f"Token id {max(ids)} is out of vocabulary")


# What vLLM's request models take as response_format's type (a Literal per variant).
_RESPONSE_FORMATS: Final = ("text", "json_object", "json_schema", "structural_tag")


def _refuse_schemaless_json_schema(json_schema: Any) -> None:
    """vLLM's 400s for a json_schema response_format without its json_schema object (the
    request models' validate_response_format), or with one that has no `name` (a required
    field of its JsonSchemaResponseFormat)."""
    if json_schema is None:
        raise SimError(
            400,
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            "response_format",
        )
    if not isinstance(json_schema, dict) or not isinstance(json_schema.get("name"), str):
        raise SimError(
            400,
            "response_format.json_schema must be an object with a string 'name'.",
            "response_format.json_schema.name",
        )


def _refuse_sampling_out_of_range(request: dict[str, Any]) -> None:
    """vLLM's SamplingParams 400s for the sampling fields the gateway passes through
    unchecked: top_p 0, top_k below -1 or fractional, min_p outside [0, 1], a
    repetition_penalty that is not a positive finite number."""
    top_p, top_k = request.get("top_p"), request.get("top_k")
    min_p, penalty = request.get("min_p"), request.get("repetition_penalty")
    if _is_number(top_p) and not 0.0 < top_p <= 1.0:
        raise SimError(400, f"top_p must be in (0, 1], got {top_p}.", "top_p")
    if _is_number(top_k) and top_k != int(top_k):
        raise SimError(400, "Invalid value for 'top_k': Input should be a valid integer.", "top_k")
    if _is_number(top_k) and top_k < -1:
        raise SimError(400, f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    if _is_number(min_p) and not 0.0 <= min_p <= 1.0:
        raise SimError(400, f"min_p must be in [0, 1], got {min_p}.")
    if _is_number(penalty) and not (math.isfinite(penalty) and penalty > 0.0):
        raise SimError(400, f"repetition_penalty must be greater than zero, got {penalty}.")


def _refuse_prompt_logprobs(request: dict[str, Any]) -> None:
    """vLLM's 400s for `prompt_logprobs` (its request models' check_logprobs, then the
    engine's --max-logprobs bound, where -1 is the whole vocabulary)."""
    asked = request.get("prompt_logprobs")
    if asked is None:
        return
    if not _is_number(asked) or asked % 1 != 0:  # vLLM types it int: 1.5 is no count
        raise SimError(400, "`prompt_logprobs` must be an integer.", "prompt_logprobs")
    if request.get("stream") and (asked > 0 or asked == -1):
        raise SimError(
            400, "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"
        )
    if asked < 0 and asked != -1:
        raise SimError(400, "`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs")
    _refuse_above_max_logprobs(asked, "prompt", "prompt_logprobs")


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _refuse_responses_tool_choice(request: dict[str, Any]) -> None:
    """vLLM's 400s for a Responses tool_choice that needs tools when there are none (its
    ResponsesRequest.check_tool_usage; "auto" and "none" then mean "none")."""
    if request.get("tools"):
        return
    choice = request.get("tool_choice")
    if choice == "required":
        message = "Tool choice 'required' must be specified with 'tools' parameter."
    elif isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        message = "Tool choice 'function' not found in 'tools' parameter."
    else:
        return
    raise SimError(400, message, "tool_choice")


def _token_id_prompts(prompt: str | list[Any]) -> list[list[int]]:
    """The prompts of token ids in a completions request's `prompt`."""
    if isinstance(prompt, str) or not prompt:
        return []
    if all(isinstance(item, int) for item in prompt):
        return [prompt]
    return [item for item in prompt if isinstance(item, list) and item]


def _refuse_min_tokens_above(max_tokens: int, min_tokens: Any) -> None:
    """vLLM's 400 for a min_tokens the answer may not reach (max_tokens, asked or the rest of
    the context). The gateway passes the field through unchecked."""
    if min_tokens is None:
        return
    if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
        raise SimError(
            400, "Invalid value for 'min_tokens': expected an integer >= 0.", "min_tokens"
        )
    if min_tokens > max_tokens:
        raise SimError(
            400,
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
        )


def _is_greedy(temperature: float | None) -> bool:
    """vLLM samples greedily below its epsilon, not only at exactly 0."""
    return temperature is not None and temperature < GREEDY_TEMPERATURE_EPS


def _top_logprobs(kind: EndpointKind, request: dict[str, Any]) -> int | None:
    """How many alternatives per token the request wants, None for no logprobs at all."""
    if kind == "completions":
        value = request.get("logprobs")
        return None if value is None else _within_max_logprobs(int(value))
    top = request.get("top_logprobs")
    if request.get("logprobs") is not True:
        if top:
            raise SimError(
                400, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )
        return None
    return _within_max_logprobs(int(top or 0))


def _within_max_logprobs(top: int) -> int:
    _refuse_above_max_logprobs(top, "sample", "logprobs")
    return top


def _refuse_above_max_logprobs(top: float, kind: str, param: str) -> None:
    """vLLM's 400 for more logprobs than --max-logprobs (-1: the whole vocabulary)."""
    wanted = tokenizer.VOCAB_SIZE if top == -1 else top
    if wanted > MAX_LOGPROBS:
        raise SimError(
            400,
            f"Requested {kind} logprobs of {wanted}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
            param,
        )


async def _read(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


def _model_permission() -> dict[str, Any]:
    """vLLM's ModelPermission with its defaults: a fresh id and time on every listing."""
    return {
        "id": f"modelperm-{uuid.uuid4().hex[:16]}",
        "object": "model_permission",
        "created": int(time.time()),
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


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
