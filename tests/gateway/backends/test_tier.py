"""A tier's slot queue: waits handed the slot of a request that ends."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.backends.tier import TierBackend, build_tiers
from gateway.config import parse_settings
from tests.helpers import API_KEY, MODEL


def one_slot_tier() -> TierBackend:
    settings = parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {
                    "name": "a",
                    "precision": "nvfp4",
                    "endpoints": ["http://127.0.0.1:9/v1"],
                    "max_inflight_per_endpoint": 1,
                },
                {"name": "b", "precision": "bf16", "endpoints": ["http://127.0.0.1:10/v1"]},
            ],
            "tenants": [{"name": "t", "api_keys": [API_KEY]}],
        }
    )
    return build_tiers(settings)[0]


def test_a_slot_handed_to_a_wait_that_ends_goes_to_the_next_waiter() -> None:
    """The slot is handed to the first waiter in the loop turn its wait ends (cancelled, or
    timed out): it is passed on, not lost while the second waiter waits out its timeout."""

    async def main() -> None:
        tier = one_slot_tier()
        endpoint = tier.endpoints[0]
        endpoint.inflight = 1
        first = asyncio.ensure_future(tier.wait_for_slot(5.0))
        second = asyncio.ensure_future(tier.wait_for_slot(1.0))
        await asyncio.sleep(0.01)
        endpoint.inflight = 0
        endpoint.slot_freed()  # handed to the first waiter...
        first.cancel()  # ...whose wait ends before it runs
        with contextlib.suppress(asyncio.CancelledError):
            await first
        assert await second is endpoint

    asyncio.run(main())
