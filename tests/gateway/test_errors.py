"""An engine's refusal reaches the client in the shape of the gateway's own refusals."""

from __future__ import annotations

import json

import pytest

from gateway.errors import engine_refusal


def refusal(status: int, body: bytes) -> dict[str, object]:
    parsed = json.loads(engine_refusal(status, body))
    assert set(parsed) == {"error"} and set(parsed["error"]) == {"message", "type", "param", "code"}
    return dict(parsed["error"])


def test_vllms_nested_error_keeps_its_message_and_param_under_the_gateways_type() -> None:
    body = {
        "error": {
            "message": "too long",
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }
    }
    assert refusal(400, json.dumps(body).encode()) == {
        "message": "too long",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": None,  # the HTTP status repeated as an int says nothing more
    }


def test_older_vllms_top_level_error_is_read_too() -> None:
    body = {
        "object": "error",
        "message": "bad prompt",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    error = refusal(400, json.dumps(body).encode())
    assert error["message"] == "bad prompt" and error["type"] == "invalid_request_error"


def test_a_named_code_and_the_413_default_survive() -> None:
    named = {"error": {"message": "m", "code": "context_length_exceeded"}}
    assert refusal(400, json.dumps(named).encode())["code"] == "context_length_exceeded"
    assert refusal(413, b'{"error": {"message": "big"}}')["code"] == "payload_too_large"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"upstream says no", "upstream says no"),
        (
            b'{"detail": "Not JSON-shaped the OpenAI way"}',
            '{"detail": "Not JSON-shaped the OpenAI way"}',
        ),
        (b'{"error": "a bare string"}', '{"error": "a bare string"}'),
        (b"", "The engine refused the request (HTTP 422)."),
        (b"\xff\xfe broken", "\ufffd\ufffd broken"),
    ],
)
def test_a_body_without_a_message_becomes_the_message(body: bytes, message: str) -> None:
    error = refusal(422, body)
    assert error["message"] == message and error["param"] is None


def test_a_long_plain_body_is_cut() -> None:
    assert len(str(refusal(400, b"x" * 100_000)["message"])) == 1000
