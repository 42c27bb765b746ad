"""Relaying a JSON answer when the gateway aborted it because its client left."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.backends.h1client import UpstreamAborted, UpstreamProtocolError, UpstreamResponse
from gateway.errors import UpstreamError
from gateway.proxy.channel import ClientChannel
from gateway.proxy.relay import Exchange, relay_body
from gateway.routing.policy import Decision
from gateway.stats import Ladder, RequestRecord


class _FailingBody:
    """An upstream response whose body read fails the way an abort or a broken peer does."""

    status = 200

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def read(self, limit: int) -> bytes:
        raise self.error


def _exchange(disconnected: bool) -> tuple[Exchange, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    channel = ClientChannel(send, receive)
    channel.disconnected = disconnected
    record = RequestRecord(
        tenant="t", kind="chat", ladder=Ladder(("a", "b"), (0.25, 1.0)), status=200
    )
    decision = Decision(tier=0, probability=0.9, reason="router")
    return Exchange("chat", {}, decision, channel, time.perf_counter(), record), sent


def _relay(exchange: Exchange, error: Exception) -> None:
    response: UpstreamResponse = _FailingBody(error)  # type: ignore[assignment]
    asyncio.run(relay_body(exchange, response))


def test_a_body_aborted_for_a_departed_client_is_recorded_as_499() -> None:
    exchange, sent = _exchange(disconnected=True)
    _relay(exchange, UpstreamAborted("aborted by the gateway"))
    assert exchange.record.status == 499 and exchange.record.client_disconnected
    assert sent == []  # nobody is left to answer


def test_a_body_failing_with_the_client_present_is_a_gateway_error() -> None:
    exchange, _ = _exchange(disconnected=False)
    with pytest.raises(UpstreamError, match="while answering"):
        _relay(exchange, UpstreamProtocolError("connection closed mid-body"))
    assert not exchange.record.client_disconnected
