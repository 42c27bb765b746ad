"""A request queued on a full tier whose client leaves ends then, not at queue_timeout_s."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.backends.tier import build_tiers
from gateway.config import parse_settings
from gateway.proxy.channel import ClientChannel
from gateway.proxy.service import ProxyService
from gateway.stats import Ladder, RequestRecord
from gateway.tenants.registry import TenantRegistry
from tests.helpers import API_KEY, MODEL, FixedPolicy

QUEUE_TIMEOUT_S = 5.0


def test_a_queued_stream_whose_client_leaves_gives_up_its_place_at_once() -> None:
    """It held its place in the queue, and its tenant's concurrency slot (a 429 for the
    tenant's retry), until queue_timeout_s although nobody waited for it any more."""
    settings = parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {
                    "name": name,
                    "precision": precision,
                    "endpoints": [f"http://127.0.0.1:{port}/v1"],  # nothing is sent
                    "max_inflight_per_endpoint": 1,
                }
                for name, precision, port in (("a", "nvfp4", 9), ("b", "bf16", 10))
            ],
            "tenants": [{"name": "t", "api_keys": [API_KEY]}],
            "resilience": {"queue_timeout_s": QUEUE_TIMEOUT_S},
        }
    )
    tiers = build_tiers(settings)
    service = ProxyService(
        MODEL,
        tiers,
        FixedPolicy(0),
        timeouts=settings.timeouts,
        resilience=settings.resilience,
    )
    tenant = TenantRegistry(settings, {}).tenants["t"]

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is answered to a client that left")

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.05)  # queued by then
        return {"type": "http.disconnect"}

    async def main() -> float:
        tiers[0].endpoints[0].inflight = 1  # full
        record = RequestRecord(tenant="t", kind="chat", ladder=Ladder(("a", "b"), (1.0, 2.0)))
        request = {"model": f"{MODEL}@a", "messages": [], "stream": True}
        started = time.perf_counter()
        await service.handle(
            "chat",
            request,
            tenant=tenant,
            header_pin=None,
            channel=ClientChannel(send, receive),
            started=started,
            record=record,
        )
        assert record.status == 499 and tiers[0].queued == 0
        return time.perf_counter() - started

    assert asyncio.run(asyncio.wait_for(main(), 2 * QUEUE_TIMEOUT_S)) < 1.0
