"""The simulator's structured output: JSON that the request's response_format accepts."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.sim import tokenizer
from gateway.sim.server import SimServer
from gateway.sim.structured import json_answer
from tests.gateway.sim.asgi import MODEL, call, chat, completion, run

WORDS = ["alpha", "beta", "gamma", "delta"]


def test_a_text_format_asks_for_no_json() -> None:
    assert json_answer(None, WORDS) is None
    assert json_answer({"type": "text"}, WORDS) is None


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "a"}}],
)
def test_json_without_a_schema_is_an_object_of_the_words(response_format: Any) -> None:
    assert orjson.loads(json_answer(response_format, WORDS) or "") == {
        "answer": "alpha beta gamma delta"
    }


def test_a_schema_instance_keeps_every_constraint_the_filler_meets() -> None:
    schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["x", "y"]},
            "fixed": {"const": 7},
            "count": {"type": "integer", "minimum": 10, "maximum": 20},
            "ratio": {"type": "number", "maximum": 1},
            "flag": {"type": "boolean"},
            "nothing": {"type": "null"},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 3}]},
            "long": {"type": ["null", "string"], "minLength": 40},
            "pair": {"type": "array", "items": {"$ref": "#/$defs/Leaf"}, "minItems": 2},
        },
        "$defs": {"Leaf": {"type": "object", "properties": {"name": {"type": "string"}}}},
    }
    value = orjson.loads(json_answer(json_schema(schema), WORDS) or "")
    assert value["kind"] == "x" and value["fixed"] == 7 and value["count"] == 10
    assert value["ratio"] == 1.0 and value["flag"] is True and value["nothing"] is None
    assert value["maybe"] == "alp" and len(value["long"]) == 40
    assert [set(leaf) for leaf in value["pair"]] == [{"name"}, {"name"}]


def test_a_recursive_schema_ends() -> None:
    schema = {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
                "required": ["label", "children"],
            }
        },
    }
    depth, node = 0, orjson.loads(json_answer(json_schema(schema), WORDS) or "")
    while node["children"]:
        depth, node = depth + 1, node["children"][0]
    assert 0 < depth <= 8


def test_a_type_that_is_no_name_gets_a_string_not_an_error() -> None:
    """`type` may be any JSON value in a client's schema; an object there raised TypeError
    (unhashable) and the simulator answered 500."""
    schema = {"type": "object", "properties": {"odd": {"type": {"nested": 1}}}}
    answer = orjson.loads(json_answer(json_schema(schema), WORDS) or "")
    assert isinstance(answer["odd"], str)


def test_the_server_answers_json_a_grammar_would_allow() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}

    async def check(server: SimServer) -> None:
        whole = (
            await call(
                server, "POST", "/v1/chat/completions", chat(response_format=json_schema(schema))
            )
        ).json()
        document = whole["choices"][0]["message"]["content"]
        assert set(orjson.loads(document)) == {"name"}
        assert whole["usage"]["completion_tokens"] == len(tokenizer.pieces(document))
        responses = {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_object"}}}
        answer = (await call(server, "POST", "/v1/responses", responses)).json()
        assert set(orjson.loads(answer["output"][0]["content"][0]["text"])) == {"answer"}

    run(check)


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_name_the_tokens_that_spell_the_json(stream: bool) -> None:
    # Joined, a JSON answer's logprob tokens are its text, as a plain answer's are.
    fmt = {"type": "json_object"}

    async def check(server: SimServer) -> None:
        asked = chat(response_format=fmt, logprobs=True, stream=stream, max_tokens=9)
        reply = await call(server, "POST", "/v1/chat/completions", asked)
        choices = (
            [c for e in reply.events() for c in e["choices"]] if stream else reply.json()["choices"]
        )
        text = "".join(
            c["delta"].get("content", "") if stream else c["message"]["content"] for c in choices
        )
        tokens = [
            t["token"] for c in choices if c.get("logprobs") for t in c["logprobs"]["content"]
        ]
        assert text.startswith('{"answer":"') and "".join(tokens) == text
        plain = completion(response_format=fmt, logprobs=1, stream=stream, max_tokens=9)
        reply = await call(server, "POST", "/v1/completions", plain)
        choices = (
            [c for e in reply.events() for c in e["choices"]] if stream else reply.json()["choices"]
        )
        text = "".join(c["text"] for c in choices)
        spelled = [
            (t, at)
            for c in choices
            if c.get("logprobs")
            for t, at in zip(c["logprobs"]["tokens"], c["logprobs"]["text_offset"], strict=True)
        ]
        assert "".join(t for t, _ in spelled) == text
        assert all(text[at:].startswith(t) for t, at in spelled)

    run(check)


def test_a_responses_format_is_not_refused_in_chats_words() -> None:
    # The Responses request is answered as a chat: a format chat would refuse must not come
    # back as a 400 naming `response_format`, a field the client never sent.
    async def check(server: SimServer) -> None:
        responses = {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema"}}}
        reply = await call(server, "POST", "/v1/responses", responses)
        assert reply.status == 200
        orjson.loads(reply.json()["output"][0]["content"][0]["text"])  # JSON, of any shape

    run(check)
