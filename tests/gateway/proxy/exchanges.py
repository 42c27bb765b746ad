"""An exchange for relay tests: a pinned chat request whose client stays, its sends kept."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.proxy.channel import ClientChannel
from gateway.proxy.relay import Exchange
from gateway.routing.policy import Decision
from gateway.stats import Ladder, RequestRecord


def pinned_exchange() -> tuple[Exchange, list[dict[str, Any]]]:
    """The exchange, and the ASGI messages sent to its client as they come."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)  # the client stays connected
        return {}

    record = RequestRecord(tenant="t", kind="chat", ladder=Ladder(("a",), (1.0,)))
    record.request_id = b"req_1"
    channel = ClientChannel(send, receive)
    return Exchange("chat", {}, Decision(0, None, "pinned"), channel, 0.0, record), sent


def relayed_body(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(message.get("body", b"") for message in sent)
