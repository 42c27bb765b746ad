"""The OpenAPI 3.1 document of the gateway, built from the protocol models.

Schemathesis and client generators read it; the request schemas are the same pydantic
models the gateway validates with, so the document cannot drift from the behaviour.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic.json_schema import models_json_schema

from gateway import __version__
from gateway.protocol import ChatCompletionRequest, CompletionRequest, ResponsesRequest

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}


# Response headers, declared once (components.headers) and referenced where they are sent.
_HEADERS: dict[str, Any] = {
    "RequestId": {
        "description": "The gateway's id of this request (`req_` and 24 hex digits); a "
        "generation request's engine builds the completion's `id` on it",
        "required": True,
        "schema": {"type": "string"},
    },
    "RetryAfter": {
        "description": "Seconds to wait before retrying, rounded up",
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
    },
    "RetryAfterMs": {
        "description": "Milliseconds to wait before retrying (the OpenAI SDKs read it first)",
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
    },
    "ShouldRetry": {
        "description": "`false` on a 502 the request itself caused (every endpoint failed on "
        "it alike, or its answer is over the size limit) and on a 504 at the request's own "
        "total_s deadline: the OpenAI SDKs then do not retry",
        "schema": {"type": "string", "enum": ["false"]},
    },
    "Tier": {
        "description": "The tier that served the request",
        "required": True,
        "schema": {"type": "string"},
    },
    "OverheadMs": {
        "description": "Time spent in the gateway, the upstream excluded",
        "required": True,
        "schema": {"type": "string"},
    },
    "Probability": {
        "description": "Calibrated probability behind the routing choice (absent when pinned)",
        "schema": {"type": "string"},
    },
}


def _headers(*names: str) -> dict[str, Any]:
    return {
        header: {"$ref": f"#/components/headers/{name}"}
        for header, name in (
            ("x-request-id", "RequestId"),
            ("retry-after", "RetryAfter"),
            ("retry-after-ms", "RetryAfterMs"),
            ("x-should-retry", "ShouldRetry"),
            ("x-tiergate-tier", "Tier"),
            ("x-tiergate-overhead-ms", "OverheadMs"),
            ("x-tiergate-p", "Probability"),
        )
        if name in names
    }


# Errors that ask for a wait, or may ask not to be retried; the others carry the id alone.
_ERROR_HEADERS: dict[int, dict[str, Any]] = {
    429: _headers("RequestId", "RetryAfter", "RetryAfterMs"),
    502: _headers("RequestId", "ShouldRetry"),
    504: _headers("RequestId", "ShouldRetry"),
    503: _headers("RequestId", "RetryAfter", "RetryAfterMs"),
}


def _error_responses(*codes: int) -> dict[str, Any]:
    """Errors under /v1: each carries its request id, and a wait where it asks for one."""
    return {
        str(code): {
            "description": "OpenAI-shaped error",
            "headers": _ERROR_HEADERS.get(code, _headers("RequestId")),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for code in codes
    }


def _generation(name: str, schema: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": name,
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}
                },
            },
            "responses": {
                "200": {
                    "description": "The upstream tier's answer, relayed (JSON, or SSE when stream)",
                    "headers": _headers("RequestId", "Tier", "OverheadMs", "Probability"),
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                **_error_responses(400, 401, 403, 404, 408, 413, 415, 429, 502, 503, 504),
            },
        }
    }


@cache
def openapi_document(public_model: str) -> dict[str, Any]:
    _, definitions = models_json_schema(
        [
            (ChatCompletionRequest, "validation"),
            (CompletionRequest, "validation"),
            (ResponsesRequest, "validation"),
        ],
        ref_template="#/components/schemas/{model}",
    )
    schemas: dict[str, Any] = dict(definitions.get("$defs", {}))
    schemas["Error"] = _ERROR_SCHEMA
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tiergate",
            "version": __version__,
            "description": f"OpenAI-compatible gateway for '{public_model}' over precision tiers.",
        },
        "components": {
            "schemas": schemas,
            "headers": _HEADERS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/v1/chat/completions": _generation("createChatCompletion", "ChatCompletionRequest"),
            "/v1/completions": _generation("createCompletion", "CompletionRequest"),
            "/v1/responses": _generation("createResponse", "ResponsesRequest"),
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": {
                            "description": "Public model and one pinned id per tier",
                            "headers": _headers("RequestId"),
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_error_responses(401),
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "operationId": "retrieveModel",
                    "security": [{"bearer": []}],
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "The model, if the caller may use it",
                            "headers": _headers("RequestId"),
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_error_responses(401, 404),
                    },
                }
            },
            "/health": {
                "get": {"operationId": "health", "responses": {"200": {"description": "alive"}}}
            },
            "/ready": {
                "get": {
                    "operationId": "ready",
                    "responses": {
                        "200": {"description": "at least one tier usable"},
                        "503": {"description": "no tier usable"},
                    },
                }
            },
        },
    }


__all__ = ["openapi_document"]
