"""OpenAI request models and the parser that turns a request body into a validated dict.

The models validate the fields the gateway reads or must keep sane; every other field is
allowed and passed upstream untouched. Validation never rebuilds the body: the parsed dict
is what gets forwarded, with only `model` rewritten.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from gateway.errors import InvalidRequestError, PayloadTooLargeError
from gateway.tenants.cache_salt import client_salt

EndpointKind = Literal["chat", "completions", "responses"]


class OpenAIModel(BaseModel):
    """Base of every protocol model: unknown fields are allowed and kept, types are strict."""

    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(OpenAIModel):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class LaxOpenAIModel(OpenAIModel):
    """For nested fields: types convert as vLLM's own models convert them ("true" is a
    bool, "-100" a float), so the gateway does not refuse what vLLM's models accept there;
    a value of the wrong kind altogether (a number for a string or an object) is refused."""

    model_config = ConfigDict(extra="allow", strict=False)


class ContentPart(LaxOpenAIModel):
    """One part of a message's content. The type may be absent (vLLM also takes bare
    `{"image_url": "..."}` parts), and a null text part is skipped by vLLM."""

    type: str | None = None
    text: str | None = None


class CalledFunction(LaxOpenAIModel):
    name: str
    arguments: str


class ToolCall(LaxOpenAIModel):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(OpenAIModel):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(LaxOpenAIModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(LaxOpenAIModel):
    """A tool as vLLM accepts it: only functions."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, Field(ge=1)]
ChoiceCount = Annotated[int, Field(ge=1, le=128)]
# vLLM's request models bound the seed to a signed 64-bit integer and answer anything
# outside with their own 400; refused here, that 400 names the field before a tier is used.
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


class SamplingFields(OpenAIModel):
    """Fields shared by both endpoints."""

    model: str = Field(min_length=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    n: ChoiceCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    # Lax as in vLLM: a token's bias may come as a numeric string.
    logit_bias: dict[str, Annotated[float, Strict(False)]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: PositiveInt | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    # -1 is the whole vocabulary; the upper bound is the engine's --max-logprobs, its 400.
    top_logprobs: Annotated[int, Field(ge=-1)] | None = None


TokenId = Annotated[int, Field(ge=0)]


class CompletionRequest(SamplingFields):
    # Token ids are never negative (vLLM's schema; its engine refuses ids past the vocabulary).
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    # 0 only with echo: the prompt's own logprobs, nothing generated (how evaluation
    # harnesses score a prompt); `parse_request` checks the pair.
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    echo: bool | None = None
    suffix: str | None = None
    logprobs: Annotated[int, Field(ge=-1)] | None = None  # as top_logprobs
    best_of: PositiveInt | None = None


class ResponsesRequest(OpenAIModel):
    """`/v1/responses` (OpenAI's Responses API, as vLLM serves it), stateless: every request
    carries its whole conversation in `input`. Items and tools are vLLM's to check."""

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    store: bool | None = None
    user: str | None = None
    # Refused by parse_request (STATEFUL_FIELDS, background: true); declared so the schema
    # names them.
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None


# Fields that point at state kept by one engine (vLLM's response store): a stateless router
# may send the next request to another tier or replica, where that state does not exist.
STATEFUL_FIELDS: Final = ("previous_response_id", "conversation")

_REQUEST_MODELS: Final[dict[EndpointKind, type[OpenAIModel]]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
    "responses": ResponsesRequest,
}


class RequestLimits(BaseModel):
    """Structural limits checked before a body reaches the router (typed settings section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_json_depth: int = Field(default=32, ge=4, le=512)
    max_messages: int = Field(default=1024, ge=1)
    # Content parts in one message, prompts in one completions request: validating each
    # member of a union per element costs ~5 us, so 300,000 parts held the loop 1.6 s.
    max_list_items: int = Field(default=4096, ge=1)
    # Content parts and tool calls over all messages, and tools: lists pydantic validates
    # element by element (~4-8 us each). max_list_items bounds each list alone, so 36
    # messages of 4,096 parts held the loop 0.6 s, and 85,000 tools 0.8 s.
    max_validated_items: int = Field(default=8192, ge=1)
    # Token ids in one completions prompt (2.5x a 100k-token context; 1.9M took 0.46 s).
    max_prompt_token_ids: int = Field(default=262_144, ge=1)
    # A body must arrive whole within this many seconds of the headers (408 otherwise).
    body_timeout_s: float = Field(default=30.0, gt=0.0, allow_inf_nan=False)


def parse_request(
    kind: EndpointKind, body: bytes, limits: RequestLimits, max_body_bytes: int | None = None
) -> dict[str, Any]:
    """Parses and validates a request body; raises InvalidRequestError (4xx) on any problem.

    `max_body_bytes` overrides the limit (a tenant's own, lower cap).
    """
    limit = limits.max_body_bytes if max_body_bytes is None else max_body_bytes
    if len(body) > limit:
        # Reading stops past the limit, so len(body) is a lower bound, not the body's size.
        raise PayloadTooLargeError(f"Request body is larger than the limit of {limit} bytes.")
    if not body:
        raise InvalidRequestError("Request body is empty; expected a JSON object.")
    try:
        data = _loads(body)
    except orjson.JSONDecodeError as exc:
        data = _parse_unusual(body, exc)
    if not isinstance(data, dict):
        raise InvalidRequestError("Request body must be a JSON object.")
    if kind != "completions":
        _check_message_count(kind, data, limits.max_messages)
    _check_sampling_sizes(data, limits.max_list_items)
    _check_depth(body, data, limits.max_json_depth)
    if kind == "responses":
        _refuse_stateful(data)
    client_salt(data.get("cache_salt"))  # the gateway hashes it: the engine never sees it
    if _plainly_valid(kind, data):
        return data  # string prompts and contents: no list to bound
    _check_list_sizes(kind, data, limits)  # before pydantic's per-element work
    try:
        _REQUEST_MODELS[kind].model_validate(data)
    except ValidationError as exc:
        raise _as_invalid_request(exc) from None
    if kind == "completions" and data.get("max_tokens") == 0 and data.get("echo") is not True:
        raise InvalidRequestError(
            "max_tokens must be at least 1, got 0 (0 is for echo: true).", param="max_tokens"
        )
    return data


def _check_message_count(kind: EndpointKind, data: dict[str, Any], limit: int) -> None:
    field = "messages" if kind == "chat" else "input"
    items = data.get(field)
    if isinstance(items, list) and len(items) > limit:
        raise InvalidRequestError(
            f"Too many {field}: {len(items)}; the limit is {limit}.", param=field
        )


def _check_sampling_sizes(data: dict[str, Any], limit: int) -> None:
    """Stop strings and logit biases are checked one by one, on the fast path too: 975,000
    stop strings cost 108 ms and 290,000 biases 160 ms. vLLM takes 4 stop strings unless
    VLLM_MAX_STOP_STRINGS says more, and a bias per token of the vocabulary at most."""
    for field in ("stop", "logit_bias"):
        value = data.get(field)
        if isinstance(value, list | dict) and len(value) > limit:
            raise InvalidRequestError(
                f"Too many entries in {field}: {len(value)}; the limit is {limit}.", param=field
            )


def _check_list_sizes(kind: EndpointKind, data: dict[str, Any], limits: RequestLimits) -> None:
    """Refuses lists whose validation alone would hold the event loop for long."""
    if kind == "completions":
        prompt = data.get("prompt")
        if isinstance(prompt, list):
            if prompt and isinstance(prompt[0], int):
                _check_length(prompt, limits.max_prompt_token_ids, "prompt", "token ids")
                return
            _check_length(prompt, limits.max_list_items, "prompt", "prompts")
            for one in prompt:
                if isinstance(one, list):
                    _check_length(one, limits.max_prompt_token_ids, "prompt", "token ids")
        return
    tools = data.get("tools")
    tool_count = len(tools) if isinstance(tools, list) else 0
    total = tool_count
    field = "messages" if kind == "chat" else "input"
    items = data.get(field)
    for index, item in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        if isinstance(content, list):
            if len(content) > limits.max_list_items:  # named as validation errors are
                _check_length(
                    content, limits.max_list_items, f"{field}.{index}.content", "content parts"
                )
            total += len(content)
        calls = item.get("tool_calls")
        if isinstance(calls, list):
            total += len(calls)
    if total > limits.max_validated_items:
        # The bound is over several lists: the param names the one that holds most of them.
        raise InvalidRequestError(
            f"Too many content parts, tool calls and tools together: {total}; the limit is "
            f"{limits.max_validated_items}.",
            param="tools" if 2 * tool_count >= total else field,
        )


def _check_length(items: list[Any], limit: int, param: str, what: str) -> None:
    if len(items) > limit:
        raise InvalidRequestError(
            f"Too many {what}: {len(items)}; the limit is {limit}.", param=param
        )


def _refuse_stateful(data: dict[str, Any]) -> None:
    for field in STATEFUL_FIELDS:
        if data.get(field) is not None:
            raise InvalidRequestError(
                f"'{field}' is not supported through tiergate: each request is routed on its "
                "own, possibly to another tier than the one that stored the earlier response. "
                "Send the whole conversation in 'input'.",
                param=field,
                code="unsupported_parameter",
            )
    if data.get("background") is True:
        # vLLM answers "queued" at once and generates on, unmetered and outside the tenant's
        # concurrency, into a store read by GET /v1/responses/{id} on that one engine only.
        raise InvalidRequestError(
            "'background' is not supported through tiergate: the answer would be kept by one "
            "engine, to be fetched later, and the gateway routes no such fetch. Send the "
            "request without it, streaming if it is long.",
            param="background",
            code="unsupported_parameter",
        )


_UTF8_BOM: Final = b"\xef\xbb\xbf"


def _loads(body: bytes) -> Any:
    """orjson's parse with the cyclic garbage collector paused: parsed JSON holds no cycle,
    yet each list it builds counts towards a collection, and a body of a million tiny lists
    set off collections that walked the growing heap again and again (the event loop held
    0.4-0.9 s, against 0.1 s without them)."""
    if not gc.isenabled():
        return orjson.loads(body)
    gc.disable()
    try:
        return orjson.loads(body)
    finally:
        gc.enable()


def _parse_unusual(body: bytes, exc: orjson.JSONDecodeError) -> Any:
    """A body orjson refused: one led by a byte order mark is parsed without it (RFC 8259
    lets a parser ignore one, and Python's json does), anything else is the client's error."""
    if body.startswith(_UTF8_BOM):
        try:
            return _loads(body[len(_UTF8_BOM) :])
        except orjson.JSONDecodeError as inner:
            exc = inner
    if "UTF-8" in str(exc):  # orjson's wording ("str is not valid UTF-8: ...") misleads
        raise InvalidRequestError("Request body is not valid UTF-8 text.") from None
    raise InvalidRequestError(f"Request body is not valid JSON: {exc}.") from None


# vLLM's completions endpoint generates this many tokens when max_tokens is unset.
COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16


def completion_budget(kind: EndpointKind, request: Mapping[str, Any]) -> tuple[str, int | None]:
    """The field that bounds the completion, as vLLM reads it, and the bound it applies
    (None: none but the context length).

    Chat: `max_completion_tokens` if set, else `max_tokens`. Completions: `max_tokens` only
    (vLLM ignores `max_completion_tokens` there), 16 when unset. Responses:
    `max_output_tokens`. All are validated before this runs.
    """
    if kind == "responses":
        return "max_output_tokens", request.get("max_output_tokens")
    if kind == "chat":
        newer = request.get("max_completion_tokens")
        if newer is not None:
            return "max_completion_tokens", newer
        return "max_tokens", request.get("max_tokens")
    asked = request.get("max_tokens")
    return "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS if asked is None else asked


# -- the common case without pydantic -------------------------------------------------------
# Most requests are a model, a list of text messages and a few scalars. Checking those by
# hand costs a fraction of a model validation; anything else (tools, content parts,
# stream_options, out-of-range or odd-typed values) takes the pydantic path, which also
# words the error. The fast path only ever accepts what the models accept (a property
# test checks the implication).
def _is_int(value: Any) -> bool:
    return type(value) is int


def _number_between(low: float, high: float) -> Any:
    def check(value: Any) -> bool:
        return type(value) in (int, float) and low <= value <= high

    return check


_FAST_FIELDS: Final[dict[str, Any]] = {
    "stream": lambda v: type(v) is bool,
    "max_tokens": lambda v: _is_int(v) and v >= 1,
    "max_completion_tokens": lambda v: _is_int(v) and v >= 1,
    "n": lambda v: _is_int(v) and 1 <= v <= 128,
    "seed": lambda v: _is_int(v) and INT64_MIN <= v <= INT64_MAX,
    "user": lambda v: type(v) is str,
    "temperature": _number_between(0.0, 2.0),
    "top_p": _number_between(0.0, 1.0),
    "presence_penalty": _number_between(-2.0, 2.0),
    "frequency_penalty": _number_between(-2.0, 2.0),
    "stop": lambda v: type(v) is str or (type(v) is list and all(type(x) is str for x in v)),
}
_ROLES: Final = frozenset(("system", "developer", "user", "assistant", "tool", "function"))
_DECLARED: Final[dict[EndpointKind, frozenset[str]]] = {
    kind: frozenset(model.model_fields) for kind, model in _REQUEST_MODELS.items()
}


def _plainly_valid(kind: EndpointKind, data: dict[str, Any]) -> bool:
    model = data.get("model")
    if type(model) is not str or not model:
        return False
    if kind == "chat":
        if not _plain_messages(data.get("messages")):
            return False
    elif kind == "responses" or type(data.get("prompt")) is not str:
        return False  # Responses requests always take the model's path
    declared = _DECLARED[kind]
    for key, value in data.items():
        if key in ("model", "messages", "prompt") or value is None:
            continue
        check = _FAST_FIELDS.get(key)
        if check is None:
            if key in declared:
                return False  # a declared field the fast path does not know: pydantic decides
            continue  # an extra field: allowed and passed through as is
        if not check(value):
            return False
    return True


def _plain_messages(messages: Any) -> bool:
    if type(messages) is not list or not messages:
        return False
    for message in messages:
        if type(message) is not dict or len(message) > 2:
            return False
        role = message.get("role")
        if type(role) is not str or role not in _ROLES:
            return False
        content = message.get("content")
        if content is not None and type(content) is not str:
            return False
        if len(message) == 2 and "content" not in message:
            return False
    return True


# Values the depth check walks in Python (about 2 us each) before the byte scan takes over:
# a body of a million tiny lists held the event loop for 2 s.
_WALK_BUDGET: Final = 10_000


def _check_depth(body: bytes, data: Any, max_depth: int) -> None:
    # Counting brackets is a C-speed scan; only bodies that could be that deep are walked.
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return
    stack: list[tuple[Any, int]] = [(data, 1)]
    walked = 0
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise _too_deep(max_depth)
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        walked += len(children)
        if walked > _WALK_BUDGET:
            if nesting_depth(body) > max_depth:
                raise _too_deep(max_depth)
            return
        stack.extend((child, depth + 1) for child in children)


def _too_deep(max_depth: int) -> InvalidRequestError:
    return InvalidRequestError(f"JSON nesting is deeper than {max_depth} levels.")


def nesting_depth(json_text: bytes) -> int:
    """The deepest nesting of valid JSON text, from its bytes in vectorised passes: brackets
    count outside strings only, and a quote opens or closes a string unless an odd run of
    backslashes escapes it."""
    text = np.frombuffer(json_text, dtype=np.uint8)
    if not text.size:
        return 0
    positions = np.arange(text.size)
    # The last position at or before each one that is not a backslash (-1: none).
    last_plain = np.maximum.accumulate(np.where(text == ord("\\"), -1, positions))
    quotes = np.flatnonzero(text == ord('"'))
    before = np.maximum(quotes - 1, 0)
    escapes = np.where(quotes > 0, before - last_plain[before], 0)
    marks = np.zeros(text.size, dtype=np.int8)
    marks[quotes[escapes % 2 == 0]] = 1
    outside = np.cumsum(marks, dtype=np.int64) % 2 == 0
    opens = (text == ord("[")) | (text == ord("{"))
    closes = (text == ord("]")) | (text == ord("}"))
    steps = (opens.astype(np.int64) - closes) * outside
    return int(np.cumsum(steps).max(initial=0))


def _as_invalid_request(exc: ValidationError) -> InvalidRequestError:
    # A union (content: a string or a list of parts) fails once per member; the error that
    # got deepest into the value names what is actually wrong (content.0.text, not content).
    # At equal depth, one of the right type but a wrong value (a token id of -1: not "should
    # be a valid string") is about the member the client meant.
    errors = exc.errors(include_url=False)
    first = max(errors, key=lambda error: (len(_path(error)), not error["type"].endswith("_type")))
    path = _path(first)
    param = ".".join(path) if path else None
    message = first["msg"]
    if first["type"] == "missing":
        message = f"Missing required parameter: '{param}'."
    elif param:
        message = f"Invalid value for '{param}': {message}."
    return InvalidRequestError(message, param=param, code="invalid_value")


def _path(error: Any) -> list[str]:
    # pydantic inserts the union member it tried (e.g. "str", "list[...]"); drop those.
    return [part for part in map(str, error["loc"]) if not _is_type_tag(part)]


def _is_type_tag(part: str) -> bool:
    return (
        part in {"str", "int", "float", "bool", "none"}
        or "[" in part
        or part.startswith("function-")
    )


__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "EndpointKind",
    "RequestLimits",
    "ResponsesRequest",
    "StreamOptions",
    "Tool",
    "completion_budget",
    "parse_request",
]
