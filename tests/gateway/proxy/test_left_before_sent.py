"""A JSON request whose client leaves before any engine had it names no tier."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.backends.h1client import UpstreamTimeout
from gateway.backends.tier import build_tiers
from gateway.config import parse_settings
from gateway.proxy.channel import ClientChannel
from gateway.proxy.service import ProxyService
from gateway.stats import Ladder, RequestRecord
from gateway.tenants.registry import TenantRegistry
from tests.helpers import API_KEY, MODEL, FixedPolicy


def test_a_client_that_leaves_while_the_engine_is_connected_to_names_no_tier() -> None:
    """The connect to the decided tier's engine outlasts the client (a host that is down
    answers no SYN): the engine never had the request, so no tier began to serve it, and
    none may count it as a 499 generated unmetered."""
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

    async def connect_times_out(*_: Any, **__: Any) -> Any:
        await asyncio.sleep(0.6)  # past the departure watch's delay: the client has left
        raise UpstreamTimeout("connecting to 127.0.0.1:9 took over 0.6s")

    tiers[0].endpoints[0].pool.request = connect_times_out  # type: ignore[method-assign]

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

    record = asyncio.run(asyncio.wait_for(main(), 5))
    assert record.status == 499 and record.client_disconnected
    assert [attempt.tier for attempt in record.attempts] == [0]
    assert record.served_tier is None
