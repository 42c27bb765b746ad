"""A JSON request whose client leaves names the tier whose engine had it, and only that."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.backends.h1client import UpstreamConnectError, UpstreamTimeout
from gateway.backends.tier import build_tiers
from gateway.config import parse_settings
from gateway.proxy.channel import ClientChannel
from gateway.proxy.service import ProxyService
from gateway.stats import Ladder, RequestRecord
from gateway.tenants.registry import TenantRegistry
from tests.helpers import API_KEY, MODEL, FixedPolicy


def _left_while(request: Callable[..., Coroutine[Any, Any, Any]]) -> RequestRecord:
    """The record of a chat request whose client leaves while the decided tier's pool runs
    `request` (a stand-in for its `request`)."""
    settings = parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": name, "precision": precision, "endpoints": [f"http://127.0.0.1:{port}/v1"]}
                for name, precision, port in (("a", "nvfp4", 9), ("b", "bf16", 10))
            ],
            "tenants": [{"name": "t", "api_keys": [API_KEY]}],
        }
    )
    tiers = build_tiers(settings)
    service = ProxyService(
        MODEL, tiers, FixedPolicy(0), timeouts=settings.timeouts, resilience=settings.resilience
    )
    tenant = TenantRegistry(settings, {}).tenants["t"]
    tiers[0].endpoints[0].pool.request = request  # type: ignore[method-assign]

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is answered to a client that left")

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    async def main() -> RequestRecord:
        record = RequestRecord(tenant="t", kind="chat", ladder=Ladder(("a", "b"), (1.0, 2.0)))
        await service.handle(
            "chat",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            tenant=tenant,
            header_pin=None,
            channel=ClientChannel(send, receive),
            started=time.perf_counter(),
            record=record,
        )
        return record

    return asyncio.run(asyncio.wait_for(main(), 5))


def test_a_client_that_leaves_while_the_engine_is_connected_to_names_no_tier() -> None:
    """The connect to the decided tier's engine outlasts the client (a host that is down
    answers no SYN): the engine never had the request, so no tier began to serve it, and
    none may count it as a 499 generated unmetered."""

    async def connect_times_out(*_: Any, **__: Any) -> Any:
        await asyncio.sleep(0.6)  # past the departure watch's delay: the client has left
        raise UpstreamTimeout("connecting to 127.0.0.1:9 took over 0.6s")

    record = _left_while(connect_times_out)
    assert record.status == 499 and record.client_disconnected
    assert [attempt.tier for attempt in record.attempts] == [0]
    assert record.served_tier is None


class _Sent:
    """A request the pool has sent (it joins `started` then), its answer still to come."""

    aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_a_client_that_leaves_once_the_engine_has_it_names_its_tier_however_it_ends() -> None:
    """Once sent, the engine generates for the request until it is aborted: a client that
    left then is the attempt's end, whatever failure the abort made of it (a reset here),
    so the tier counts the 499 as generated unmetered, and the engine no failure."""
    sent = _Sent()

    async def sent_then_reset(*_: Any, started: list[Any], **__: Any) -> Any:
        started.append(sent)
        await asyncio.sleep(0.6)  # past the departure watch's delay: the client has left
        raise UpstreamConnectError("connection reset by peer")

    record = _left_while(sent_then_reset)
    assert sent.aborted  # the engine was told to stop
    assert record.status == 499 and record.client_disconnected
    assert [(attempt.tier, attempt.outcome) for attempt in record.attempts] == [(0, "client_gone")]
    assert record.served_tier == 0
