"""The lean pass-through the gateway is measured against: the same server stack (uvicorn,
httptools, uvloop) and the same upstream client, and nothing else (no auth, validation,
routing, metrics or observer). Run: python benchmarks/lean_proxy.py PORT UPSTREAM_PORT
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

from gateway.backends.h1client import ConnectionPool


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def make_app(upstream: ConnectionPool) -> Any:
    """The pass-through as an ASGI app forwarding to `upstream`."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        request = upstream.render(b"POST", scope["path"].encode(), body)
        response = await upstream.request(request, first_byte_timeout_s=60, total_timeout_s=120)
        headers = [(b"content-type", response.header(b"content-type") or b"application/json")]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        async for chunk in response:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        response.release()

    return app


def make_aiohttp_app(session: Any, upstream_url: Any) -> Any:
    """The same pass-through on aiohttp's client (a pooled `ClientSession`): what
    `benchmarks/upstream_client.py` weighs the gateway's own client against. `upstream_url`
    is the whole target URL, parsed once (a `yarl.URL`)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {"content-type": "application/json"}
        async with session.post(upstream_url, data=body, headers=headers) as up:
            content_type = up.headers.get("content-type", "application/json").encode()
            start = {"type": "http.response.start", "status": up.status}
            await send({**start, "headers": [(b"content-type", content_type)]})
            async for chunk in up.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


if __name__ == "__main__":
    uvicorn.run(
        make_app(ConnectionPool("127.0.0.1", int(sys.argv[2]))),
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        server_header=False,
        lifespan="off",
    )
