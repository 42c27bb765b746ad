"""Generated traffic, valid and malformed: never a 5xx, every 4xx OpenAI-shaped.

Schemathesis drives the OpenAPI document the gateway serves (positive and negative
generation); hypothesis adds arbitrary bytes and arbitrary JSON that no schema describes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.api.openapi import openapi_document
from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, send

pytestmark = pytest.mark.slow


def _document() -> dict[str, Any]:
    document = copy.deepcopy(openapi_document(MODEL))
    # Aim valid requests at real tiers, so generated bodies travel all the way upstream.
    models = [MODEL, *(f"{MODEL}@{t}" for t in ("nvfp4", "w4a16", "bf16")), "unknown-model"]
    for name, budget in (
        ("ChatCompletionRequest", "max_tokens"),
        ("CompletionRequest", "max_tokens"),
        ("ResponsesRequest", "max_output_tokens"),
    ):
        schema = document["components"]["schemas"][name]
        schema["properties"]["model"] = {"type": "string", "enum": models}
        # Streams are relayed as SSE; this test covers the JSON endpoints (the scope).
        schema["properties"]["stream"] = {"type": "boolean", "enum": [False]}
        schema["properties"][budget] = {"type": "integer", "minimum": 1, "maximum": 64}
    return document


schema = schemathesis.openapi.from_dict(_document())
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
    max_examples=60,
)


@pytest.fixture(scope="module")
def fuzz_gw(ladder: Ladder) -> Iterator[GatewayThread]:
    with GatewayThread(ladder.settings()) as running:
        yield running


def assert_openai_shaped(status: int, payload: bytes) -> None:
    assert status < 500, payload[:500]
    if status >= 400:
        error = json.loads(payload)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str) and error["message"]


@schema.include(method="POST").parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_schema_generated_requests(case: Any, fuzz_gw: GatewayThread) -> None:
    response = case.call(
        base_url=fuzz_gw.url, headers={"authorization": f"Bearer {API_KEY}"}, timeout=30
    )
    assert_openai_shaped(response.status_code, response.content)
    assert "x-request-id" in response.headers  # every answer under /v1
    declared = required_headers(case.path, case.method, response.status_code)
    assert not [name for name in declared if name not in response.headers], declared


def required_headers(path: str, method: str, status: int) -> list[str]:
    """The response headers the OpenAPI document says are always there for this answer."""
    document = openapi_document(MODEL)
    operation = document["paths"][path].get(method.lower(), {})  # negative cases try others
    response = operation.get("responses", {}).get(str(status), {})
    components = document["components"]["headers"]
    return [
        name
        for name, ref in response.get("headers", {}).items()
        if components[ref["$ref"].rsplit("/", 1)[1]].get("required", False)
    ]


def post_raw(gw: GatewayThread, body: bytes, path: str) -> tuple[int, bytes]:
    reply = send("POST", f"{gw.url}{path}", body)
    return reply.status, reply.body


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
chat_like = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, f"{MODEL}@bf16", "x"]) | json_values},
    optional={
        "messages": json_values
        | st.lists(
            st.dictionaries(
                st.sampled_from(["role", "content", "name", "tool_calls"]), json_values
            ),
            max_size=3,
        ),
        "max_tokens": json_values,
        "n": json_values,
        "temperature": json_values,
        "stream_options": json_values,
        "prompt": json_values,
        "input": json_values
        | st.lists(
            st.dictionaries(
                st.sampled_from(["role", "content", "type", "call_id", "output"]), json_values
            ),
            max_size=3,
        ),
        "instructions": json_values,
        "max_output_tokens": json_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.binary(max_size=300) | chat_like.map(lambda d: json.dumps(d).encode()),
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses"]),
)
def test_arbitrary_bodies(fuzz_gw: GatewayThread, body: bytes, path: str) -> None:
    status, payload = post_raw(fuzz_gw, body, path)
    assert_openai_shaped(status, payload)
