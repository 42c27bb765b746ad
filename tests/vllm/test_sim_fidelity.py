"""The simulator answers in real vLLM's shapes: the same requests to a vLLM server and to a
`tiergate sim`, compared field by field (keys and value types, not values).

Covers what README says the simulator does beyond plain text: the Responses API (a
Response object and its typed event stream), logprobs in the chat and
completions shapes, streamed and not, usage in every event (`continuous_usage_stats`), one
event per choice when n > 1, a list of prompts in one completions request, `echo` (with an
answer, streamed, and alone with max_tokens 0), and the
400s vLLM gives for `top_logprobs` without `logprobs`, an empty prompt (list), greedy sampling
with n > 1, `suffix` (`best_of` it accepts) and a malformed /tokenize body, and the 401 of
a server started with an API key.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import Sim, free_port
from tests.vllm.deployment import ENGINE_API_KEY, Deployment
from tests.vllm.support import ENGINE_HEADERS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

SIM_MODEL = "sim-fidelity"
MESSAGES = [{"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    running = Sim("nvfp4", free_port(), SIM_MODEL, extra_args=("--api-key", ENGINE_API_KEY)).start()
    yield running
    running.stop()


def shape(value: Any) -> Any:
    """Keys and value types: what a client's parser depends on."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "null" if value is None else type(value).__name__


def keyed_by_token(logprobs: dict[str, Any]) -> dict[str, Any]:
    """Completions' top_logprobs are keyed by the tokens themselves: one placeholder key."""
    tops = [{"<token>": value} for top in logprobs["top_logprobs"] if top for value in top.values()]
    return {**logprobs, "top_logprobs": tops[:1]}


def post(
    url: str, body: dict[str, Any], headers: dict[str, str] = ENGINE_HEADERS
) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    if raw.startswith(("data:", "event:")):  # SSE; a Responses stream names its events
        events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
        return status, [json.loads(e) for e in events if e != "[DONE]"]
    return status, json.loads(raw)


class Pair:
    """One request to both servers, each under its own model name."""

    def __init__(self, deployment: Deployment, sim: Sim) -> None:
        server = deployment["plain"]
        self.targets = [(server.url, server.served_model_name), (sim.url, SIM_MODEL)]

    def __call__(
        self, path: str, body: dict[str, Any], headers: dict[str, str] = ENGINE_HEADERS
    ) -> list[tuple[int, Any]]:
        return [
            post(f"{url}{path}", {**body, "model": model}, headers) for url, model in self.targets
        ]


@pytest.fixture(scope="module")
def both(deployment: Deployment, sim: Sim) -> Pair:
    return Pair(deployment, sim)


CHAT = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
TEXT = {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
RESPONSE = {"input": "Name three rivers.", "max_output_tokens": 3, "temperature": 0}
USAGE = {"stream_options": {"include_usage": True}}
USAGE_EVERYWHERE = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
SAMPLED_N = {"n": 2, "temperature": 0.8, "seed": 7}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", CHAT),
    "chat-logprobs": ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2}),
    "chat-stream-usage": ("/v1/chat/completions", {**CHAT, "stream": True, **USAGE}),
    "chat-stream-logprobs": ("/v1/chat/completions", {**CHAT, "stream": True, "logprobs": True}),
    "completions": ("/v1/completions", TEXT),
    "completions-logprobs": ("/v1/completions", {**TEXT, "logprobs": 2}),
    "completions-prompt-list": (
        "/v1/completions",
        {
            **TEXT,
            "prompt": ["Once upon a time", "The capital of France"],
            "n": 2,
            "temperature": 0.8,
            "seed": 7,
        },
    ),
    "completions-best-of": ("/v1/completions", {**TEXT, "best_of": 2, "temperature": 0.8}),
    "completions-stream-usage": ("/v1/completions", {**TEXT, "stream": True, **USAGE}),
    "completions-stream-logprobs": ("/v1/completions", {**TEXT, "stream": True, "logprobs": 1}),
    # usage in every event: the role event's, a token event's and the closing usage event
    "chat-stream-continuous-usage": (
        "/v1/chat/completions",
        {**CHAT, "stream": True, **USAGE_EVERYWHERE},
    ),
    "completions-stream-continuous-usage": (
        "/v1/completions",
        {**TEXT, "stream": True, **USAGE_EVERYWHERE},
    ),
    # n > 1: one event per choice (the two role events, for chat)
    "chat-stream-n": ("/v1/chat/completions", {**CHAT, "stream": True, **SAMPLED_N}),
    "completions-stream-n": ("/v1/completions", {**TEXT, "stream": True, **SAMPLED_N}),
    # echo: the prompt before the answer; with max_tokens 0, the prompt alone (scoring)
    "completions-echo": ("/v1/completions", {**TEXT, "echo": True, "logprobs": 1}),
    "completions-echo-scoring": (
        "/v1/completions",
        {**TEXT, "max_tokens": 0, "echo": True, "logprobs": 1},
    ),
    "completions-stream-echo": (
        "/v1/completions",
        {**TEXT, "stream": True, "echo": True, "logprobs": 1},
    ),
    # the Responses API: a Response object, and its typed event stream
    "responses": ("/v1/responses", RESPONSE),
    "responses-stream": ("/v1/responses", {**RESPONSE, "stream": True}),
}


def keyed_shape(value: Any) -> Any:
    """`shape`, with completions' top_logprobs (keyed by the tokens themselves) reduced to
    one placeholder key."""
    if isinstance(value, dict):
        logprobs = value.get("logprobs")
        if isinstance(logprobs, dict) and "text_offset" in logprobs:
            value = {**value, "logprobs": keyed_by_token(logprobs)}
        return {key: keyed_shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return [keyed_shape(value[0])] if value else []
    return shape(value)


@pytest.mark.parametrize("case", CASES)
def test_same_fields_as_vllm(both: Pair, case: str) -> None:
    path, body = CASES[case]
    (vllm_status, vllm), (sim_status, sim) = both(path, body)
    assert vllm_status == sim_status == 200
    if isinstance(vllm, dict):
        assert keyed_shape(sim) == keyed_shape(vllm)
        indices = [[c["index"] for c in answer.get("choices", ())] for answer in (sim, vllm)]
        assert indices[0] == indices[1]
        return
    # Streams: the opening event, one in the middle and the closing one. A loaded vLLM may
    # merge a request's outputs into fewer events (its output collector aggregates what the
    # API server has not read yet; seen once in CI): then the closing events are compared.
    assert isinstance(sim, list) and len(sim) >= 3 and vllm
    for at in (0, 1, -1) if len(vllm) >= 3 else (-1,):
        assert keyed_shape(sim[at]) == keyed_shape(vllm[at]), at


def test_logprobs_count_as_vllms(both: Pair) -> None:
    (_, vllm), (_, sim) = both("/v1/chat/completions", CASES["chat-logprobs"][1])
    for answer in (vllm, sim):
        content = answer["choices"][0]["logprobs"]["content"]
        assert len(content) == 3 and all(len(t["top_logprobs"]) == 2 for t in content)
    for case in ("completions-logprobs", "completions-stream-logprobs"):
        path, body = CASES[case]
        for _, answer in both(path, body):
            events = answer if isinstance(answer, list) else [answer]
            parts = [c["logprobs"] for e in events for c in e["choices"] if c.get("logprobs")]
            offsets = [offset for part in parts for offset in part["text_offset"]]
            assert len(offsets) == 3 and offsets == sorted(offsets), case


def test_stop_strings_as_vllms(both: Pair) -> None:
    body = {**TEXT, "max_tokens": 8}
    wholes = [answer["choices"][0]["text"] for _, answer in both("/v1/completions", body)]
    # A piece from inside each server's own answer, wherever its words break; both get both.
    stops = [text[2:4] for text in wholes]
    cut = both("/v1/completions", {**body, "stop": stops})
    for whole, (status, answer) in zip(wholes, cut, strict=True):
        choice = answer["choices"][0]
        at = min(whole.find(stop) for stop in stops if stop in whole)
        assert status == 200 and choice["finish_reason"] == "stop", answer
        assert choice["text"] == whole[:at]
        assert whole.find(choice["stop_reason"]) == at  # the string that matched first


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "top_logprobs": 2}),
        ("/v1/completions", {"prompt": [], "max_tokens": 2}),
        ("/v1/completions", {"prompt": "", "max_tokens": 2}),
        ("/tokenize", {"messages": [1]}),
        ("/v1/completions", {**TEXT, "n": 2}),
        ("/v1/completions", {**TEXT, "suffix": "the end"}),
        ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
        ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}),
        ("/v1/completions", {**TEXT, "logprobs": -1}),
        ("/v1/completions", {**TEXT, "prompt": [-1]}),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}),
    ],
    ids=[
        "top_logprobs-without-logprobs",
        "empty-prompt-list",
        "empty-prompt",
        "tokenize-malformed-messages",
        "greedy-with-n-2",
        "suffix",
        "stream_options-without-stream",
        "top_logprobs-over-max-logprobs",
        "logprobs-of-the-whole-vocabulary",
        "negative-token-id",
        "unknown-response-format",
    ],
)
def test_the_same_client_errors(both: Pair, path: str, body: dict[str, Any]) -> None:
    (vllm_status, vllm), (sim_status, sim) = both(path, body)
    assert vllm_status == sim_status == 400, (vllm, sim)
    assert shape(sim) == shape(vllm)


@pytest.mark.parametrize(
    "authorization", [None, "Bearer sk-wrong", f"Basic {ENGINE_API_KEY}"], ids=str
)
def test_the_same_refusal_without_the_engines_key(both: Pair, authorization: str | None) -> None:
    """Both run with an API key (vLLM's VLLM_API_KEY, the simulator's --api-key): a /v1 call
    without it gets the same 401, and /tokenize stays open on both."""
    headers = {"content-type": "application/json"}
    if authorization is not None:
        headers["authorization"] = authorization
    assert both("/v1/chat/completions", CHAT, headers) == [(401, {"error": "Unauthorized"})] * 2
    tokenized = both("/tokenize", {"prompt": "hello"}, headers)
    assert [status for status, _ in tokenized] == [200, 200]


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=ENGINE_HEADERS), timeout=120
        ) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_same_model_cards_and_answers_to_what_is_not_served(both: Pair) -> None:
    """/v1/models' cards field by field; an unknown path gets FastAPI's bare 404 from both,
    and an unknown model the same 404 shape."""
    listings = [get(f"{url}/v1/models") for url, _ in both.targets]
    assert [status for status, _ in listings] == [200, 200]
    vllm_card, sim_card = (listing["data"][0] for _, listing in listings)
    assert shape(sim_card) == shape(vllm_card)
    assert [get(f"{url}/no/such/path") for url, _ in both.targets] == [
        (404, {"detail": "Not Found"})
    ] * 2
    unknown = [
        post(f"{url}/v1/chat/completions", {**CHAT, "model": "no-such-model"})
        for url, _ in both.targets
    ]
    assert [status for status, _ in unknown] == [404, 404]
    assert shape(unknown[1][1]) == shape(unknown[0][1])
