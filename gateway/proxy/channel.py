"""The client side of a proxied exchange, over raw ASGI.

uvicorn's `send` silently drops data once the client has gone, so a disconnect is only
seen through `receive()`. The channel watches it in a small task and calls back, which lets
the proxy abort the upstream request at once (the engine then frees the sequence).

uvicorn's `send` also waits, for as long as the client keeps its socket open, while earlier
answers on the connection lie unread (a client that pipelines requests and reads nothing).
A one-shot answer (`respond`) is given up on after its deadline: the request ends, and gives
back the slots it held, instead of waiting for the client for good. Streams bound their
writes themselves (relay.relay_stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.coarse_timers import CoarseTimers

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class ClientChannel:
    __slots__ = (
        "_before_finish",
        "_deadlines",
        "_on_disconnect",
        "_receive",
        "_send",
        "_watcher",
        "disconnected",
        "finished",
        "started",
        "unread",
    )

    def __init__(self, send: Send, receive: Receive, deadlines: CoarseTimers | None = None) -> None:
        self._send = send
        self._receive = receive
        # Bounds how long `respond` waits for a client that does not read (None: no bound).
        self._deadlines = deadlines
        self.unread = False  # `respond` gave up: the client did not take the answer in time
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
        """A complete, non-streamed response; `unread` once the client has not taken it
        within the deadlines' delay (the answer is then dropped)."""
        headers.append((b"content-length", str(len(data)).encode()))
        deadlines = self._deadlines
        task = asyncio.current_task() if deadlines is not None else None
        if deadlines is None or task is None:
            await self.start(status, headers)
            await self.body(data, more=False)
            return
        # A coarse timer (a dict entry): a send waits only behind unread answers, and a
        # timer of its own would cost every answer more than its write.
        deadlines.add(task, task.cancel, None)
        try:
            await self.start(status, headers)
            await self.body(data, more=False)
        except asyncio.CancelledError:
            if deadlines.discard(task) or task.uncancel():
                raise  # not the deadline (a shutdown), or it and another cancel at once
            self.unread = True
        finally:
            deadlines.discard(task)

    def close(self) -> None:
        """Stops watching; the watcher ends by itself once uvicorn completes the response."""
        self.finished = True
        self._on_disconnect = None


__all__ = ["ClientChannel", "Receive", "Send"]
