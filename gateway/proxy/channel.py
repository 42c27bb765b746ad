"""The client side of a proxied exchange, over raw ASGI.

uvicorn's `send` silently drops data once the client has gone, so a disconnect is only
seen through `receive()`. The channel watches it in a small task and calls back, which lets
the proxy abort the upstream request at once (the engine then frees the sequence).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class ClientChannel:
    __slots__ = (
        "_before_finish",
        "_on_disconnect",
        "_receive",
        "_send",
        "_watcher",
        "disconnected",
        "finished",
        "started",
    )

    def __init__(self, send: Send, receive: Receive) -> None:
        self._send = send
        self._receive = receive
        self._watcher: asyncio.Task[None] | None = None
        self._on_disconnect: Callable[[], None] | None = None
        self._before_finish: Callable[[], Awaitable[None]] | None = None
        self.started = False
        self.finished = False
        self.disconnected = False

    def watch_disconnect(self, on_disconnect: Callable[[], None]) -> None:
        """Calls `on_disconnect` if the client goes away before the response is complete."""
        self._on_disconnect = on_disconnect
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                break
        if not self.finished:
            self.disconnected = True
            if self._on_disconnect is not None:
                self._on_disconnect()

    def before_finish(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Runs `hook` once, just before the response's last byte goes out: what the client
        sees as the end of its request must already be over for the gateway (a limit slot
        released before a sequential client's next request can arrive)."""
        self._before_finish = hook

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, *, more: bool) -> None:
        if not more:
            self.finished = True
            if self._before_finish is not None:
                hook, self._before_finish = self._before_finish, None
                await hook()
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], data: bytes) -> None:
        """A complete, non-streamed response."""
        headers.append((b"content-length", str(len(data)).encode()))
        await self.start(status, headers)
        await self.body(data, more=False)

    def close(self) -> None:
        """Stops watching; the watcher ends by itself once uvicorn completes the response."""
        self.finished = True
        self._on_disconnect = None


__all__ = ["ClientChannel", "Receive", "Send"]
