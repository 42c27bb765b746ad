"""Calls a SimServer in process, through ASGI: no sockets, no uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.planner.costmodel import CostModel
from gateway.sim.engine import EngineConfig
from gateway.sim.server import SimServer

MODEL = "sim-test"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[dict[str, Any]]:
        """The JSON events of an SSE body, [DONE] left out."""
        lines = self.body.decode().split("\n\n")
        data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        return [orjson.loads(item) for item in data if item != "[DONE]"]


def new_server() -> SimServer:
    config = EngineConfig(precision="nvfp4", cost_model=CostModel.preset("h200"))
    return SimServer(config, MODEL, seed=1)


async def call(server: SimServer, method: str, path: str, body: Any = None) -> Reply:
    """One request; the engine must be running (see `run`)."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body) if body is not None else b""
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await never.wait()  # the client stays connected
        return {"type": "http.disconnect"}

    status = 0
    parts: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            parts.append(message.get("body", b""))

    scope = {"type": "http", "method": method, "path": path}
    await server(scope, receive, send)
    return Reply(status, b"".join(parts))


def run(test: Callable[[SimServer], Awaitable[None]]) -> None:
    """Runs `test` against a fresh server whose engine is running."""

    async def main() -> None:
        server = new_server()
        server.engine.start()
        try:
            await test(server)
        finally:
            await server.engine.stop()

    asyncio.run(main())


def chat(**fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Name three rivers of Europe."}]
    return {"model": MODEL, "messages": messages, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", **fields}


__all__ = ["MODEL", "Reply", "call", "chat", "completion", "new_server", "run"]
