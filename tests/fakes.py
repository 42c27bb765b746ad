"""A scriptable fake OpenAI upstream that records what the gateway sent it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn

from tests.helpers import free_port

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class Reply:
    """What the fake answers: a status and a body, or a list of raw stream pieces."""

    status: int = 200
    body: bytes = b"{}"
    pieces: list[bytes] | None = None  # streamed as separate writes, verbatim
    content_type: bytes = b"application/json"  # empty: no content-type header
    delay_s: float = 0.0
    # A content-length above len(body) makes the answer stop short: the connection closes
    # mid-body (uvicorn refuses to finish a response shorter than it declared).
    declared_length: int | None = None
    piece_interval_s: float = 0.001  # between stream pieces
    silent_after_s: float = 0.0  # after the last piece, before the end (a stalled engine)


@dataclass
class FakeUpstream:
    reply: Reply = field(default_factory=Reply)
    # OpenAI API calls (/v1/...) as the gateway forwarded them. The regime observer's own
    # background calls (POST /tokenize, GET /metrics) land at any moment, so they are kept
    # apart: a test reading the last forwarded request must not get one of those.
    received: list[tuple[str, bytes]] = field(default_factory=list)
    background: list[tuple[str, bytes]] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        path = scope["path"]
        (self.received if path.startswith("/v1/") else self.background).append((path, body))
        reply = self.reply
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        headers = [(b"content-type", reply.content_type)] if reply.content_type else []
        if reply.pieces is None:
            length = len(reply.body) if reply.declared_length is None else reply.declared_length
            headers.append((b"content-length", str(length).encode()))
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            await send({"type": "http.response.body", "body": reply.body})
            return
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        for piece in reply.pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await asyncio.sleep(reply.piece_interval_s)
        if reply.silent_after_s:
            await asyncio.sleep(reply.silent_after_s)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def last_json(self) -> Any:
        return orjson.loads(self.received[-1][1])

    def __enter__(self) -> FakeUpstream:
        config = uvicorn.Config(
            self, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve()), daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "fake upstream did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"
