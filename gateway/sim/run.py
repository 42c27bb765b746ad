"""Running a simulated tier: uvicorn around SimServer, with connection-level faults."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.sim.server import SimServer, StreamDropped


class _QuietDrops(logging.Filter):
    """Injected stream drops are intended; keep them out of the error log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamDropped)


def _protocol_for(sim: SimServer) -> type[HttpToolsProtocol]:
    class SimProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if sim.faults.refuse_connections:
                # Reset at accept: the client sees the connection fail before any response.
                transport.abort()  # type: ignore[attr-defined]
                return
            sim.connections.add(transport)
            super().connection_made(transport)  # type: ignore[arg-type]

        def data_received(self, data: bytes) -> None:
            if self.transport is None or self.transport.is_closing():
                return
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if getattr(self, "transport", None) is None:
                return
            sim.connections.discard(self.transport)
            super().connection_lost(exc)

    return SimProtocol


def sim_config(sim: SimServer, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    logging.getLogger("uvicorn.error").addFilter(_QuietDrops())
    return uvicorn.Config(
        sim,
        host=host,
        port=port,
        loop="uvloop",
        http=_protocol_for(sim),
        lifespan="on",
        access_log=False,
        log_level=log_level,
        server_header=False,
        timeout_keep_alive=30,
        backlog=4096,
    )


async def serve(sim: SimServer, host: str, port: int, **kwargs: Any) -> None:
    await uvicorn.Server(sim_config(sim, host, port, **kwargs)).serve()


__all__ = ["serve", "sim_config"]
