"""What a client reads of an upstream failure: its kind, never the endpoint's address."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.backends.h1client import (
    ConnectionPool,
    UpstreamConnectError,
    UpstreamFailure,
    UpstreamResponse,
    UpstreamTimeout,
)
from gateway.proxy.attempts import _classified
from gateway.proxy.channel import ClientChannel
from gateway.proxy.relay import Exchange, relay_stream
from gateway.routing.policy import Decision
from gateway.stats import Ladder, RequestRecord
from tests.gateway.proxy.exchanges import pinned_exchange, relayed_body
from tests.helpers import free_port

ADDRESS = "10.7.7.7:8123"


def _refused() -> tuple[UpstreamConnectError, str]:
    port = free_port()  # nothing listens there once free_port has closed its socket

    async def connect() -> None:
        pool = ConnectionPool("127.0.0.1", port, connect_timeout_s=1.0)
        await pool.request(
            pool.render(b"GET", b"/health", b""), first_byte_timeout_s=1, total_timeout_s=1
        )

    with pytest.raises(UpstreamConnectError) as caught:
        asyncio.run(connect())
    return caught.value, f"127.0.0.1:{port}"


def test_a_refused_connection_is_told_without_the_endpoint_address() -> None:
    exc, address = _refused()
    assert address in str(exc)  # the log still has it
    message = _classified(exc).error.message
    assert address not in message and "unreachable" in message


def test_a_timeout_is_told_without_the_endpoint_address() -> None:
    exc = UpstreamTimeout(f"upstream {ADDRESS} passed the first byte deadline")
    message = _classified(exc).error.message
    assert ADDRESS not in message and "timed out" in message


class _CutStream:
    """An upstream stream that sends one event, then fails."""

    def __init__(self, failure: UpstreamFailure) -> None:
        self.failure = failure
        self.sent = False

    def __aiter__(self) -> _CutStream:
        return self

    async def __anext__(self) -> bytes:
        if self.sent:
            raise self.failure
        self.sent = True
        return b'data: {"choices":[]}\n\n'

    def abort(self) -> None:
        pass


def test_a_stream_cut_by_a_timeout_ends_without_the_endpoint_address() -> None:
    exchange, sent = pinned_exchange()
    stream = _CutStream(UpstreamTimeout(f"upstream {ADDRESS} passed the first byte deadline"))
    response: UpstreamResponse = stream  # type: ignore[assignment]
    asyncio.run(relay_stream(exchange, response, stall_s=60.0))
    body = relayed_body(sent)
    assert b"timed out" in body and ADDRESS.encode() not in body


def test_the_served_tiers_probability_is_told_only_when_known() -> None:
    """x-tiergate-p and the shadow labels' prediction are the serving tier's probability;
    after a failover under a policy that gave the decided tier's alone, none is told."""

    async def noop(message: Any) -> None:
        return None

    async def nothing() -> Any:
        return {"type": "http.disconnect"}

    def served_by(served: int, decision: Decision) -> float | None:
        record = RequestRecord(tenant="t", kind="chat", ladder=Ladder(("a", "b"), (0.25, 1.0)))
        record.served_tier = served
        channel = ClientChannel(noop, nothing)
        return Exchange("chat", {}, decision, channel, 0.0, record).served_probability()

    routed = Decision(0, 0.8, "router", (0.8, 1.0))
    assert served_by(0, routed) == 0.8
    assert served_by(1, routed) == 1.0  # failed over to the top tier
    alone = Decision(0, 0.8, "router")
    assert served_by(0, alone) == 0.8
    assert served_by(1, alone) is None
