"""Background calls to a tier endpoint: GET /metrics, POST /tokenize (vLLM's, at the root).

They share the endpoint's pool with traffic; failures return None, never raise.
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson

from gateway.backends.h1client import UpstreamFailure
from gateway.backends.tier import EndpointState


async def get(endpoint: EndpointState, path: bytes) -> bytes | None:
    return await _call(endpoint, endpoint.pool.render(b"GET", _root(endpoint) + path, b""))


async def tokenize(endpoint: EndpointState, query: dict[str, Any]) -> list[int] | None:
    body = await _call(
        endpoint, endpoint.pool.render(b"POST", _root(endpoint) + b"/tokenize", orjson.dumps(query))
    )
    if body is None:
        return None
    with contextlib.suppress(orjson.JSONDecodeError):
        tokens = orjson.loads(body).get("tokens")
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return tokens
    return None


async def _call(endpoint: EndpointState, request: bytes) -> bytes | None:
    try:
        response = await endpoint.pool.request(
            request, first_byte_timeout_s=10.0, total_timeout_s=30.0
        )
    except UpstreamFailure:
        return None
    try:
        body = await response.read(16 * 1024 * 1024)
    except UpstreamFailure:
        return None
    finally:
        response.release()
    return body if response.status == 200 else None


def _root(endpoint: EndpointState) -> bytes:
    base = endpoint.endpoint.base_path
    return (base[: -len("/v1")] if base.endswith("/v1") else base).encode()


__all__ = ["get", "tokenize"]
