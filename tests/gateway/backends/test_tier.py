"""A tier's slot queue: waits handed the slot of a request that ends."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.backends.tier import TierBackend, build_tiers
from gateway.config import Settings, parse_settings
from tests.helpers import API_KEY, MODEL


def one_slot_tier_settings() -> Settings:
    return parse_settings(
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


def one_slot_tier() -> TierBackend:
    return build_tiers(one_slot_tier_settings())[0]


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


def test_a_slot_handed_to_a_waiter_is_not_taken_before_it_resumes() -> None:
    """Between the hand-over and the waiter's next step, a new request that runs first must
    see the endpoint full: it took the slot too (2 in flight with a limit of 1)."""

    async def main() -> None:
        tier = one_slot_tier()
        endpoint = tier.endpoints[0]
        endpoint.inflight = 1
        waiting = asyncio.ensure_future(tier.wait_for_slot(5.0))
        await asyncio.sleep(0.01)
        endpoint.inflight = 0
        endpoint.slot_freed()  # handed over; the waiter has not run yet
        assert endpoint.saturated and tier.pick() is None  # no one else gets it
        assert await waiting is endpoint
        assert not endpoint.saturated and endpoint.reserved == 0  # the waiter sends on it
        endpoint.inflight = 1
        timed_out = asyncio.ensure_future(tier.wait_for_slot(0.05))
        await asyncio.sleep(0.01)
        endpoint.inflight = 0
        endpoint.slot_freed()
        timed_out.cancel()  # its wait ends before it runs: the reservation goes with it
        with contextlib.suppress(asyncio.CancelledError):
            await timed_out
        assert endpoint.reserved == 0 and tier.pick() is endpoint

    asyncio.run(main())


def test_a_request_queues_on_a_tier_that_can_free_a_slot() -> None:
    """With the engines answering 429/503 no tier is full in the gateway's count: the queue
    is the cheapest usable tier's, not the cheapest tier's when that one is down (nothing
    would ever wake a request queued there)."""
    from gateway.proxy.service import queue_tier

    cheap, top = build_tiers(one_slot_tier_settings())
    cheap.endpoints[0].healthy = False
    assert queue_tier([cheap, top]) is top
    cheap.endpoints[0].healthy = True
    assert queue_tier([cheap, top]) is cheap
    top.endpoints[0].inflight = top.endpoints[0].max_inflight  # the gateway saw it full
    assert queue_tier([cheap, top]) is top
    top.endpoints[0].healthy = cheap.endpoints[0].healthy = False
    assert queue_tier([cheap, top]) is None


def test_a_slot_freed_on_an_endpoint_a_reload_removed_is_not_handed_to_the_queue() -> None:
    """The reloaded tier takes over the queue of the tier it replaces; an endpoint the reload
    removed still ends the requests it had. Its freed slot must not send a request queued
    after the reload to that endpoint, which is no longer in the configuration."""
    from gateway.backends.tier import endpoints_by_url

    async def main() -> None:
        old = build_tiers(one_slot_tier_settings())
        data = one_slot_tier_settings().model_dump(mode="json")
        data["tiers"][0]["endpoints"] = ["http://127.0.0.1:11/v1"]
        new = build_tiers(parse_settings(data), endpoints_by_url(old))
        for tier, replaced in zip(new, old, strict=True):
            tier.adopt_endpoints()
            tier.take_queue(replaced)
        removed, current = old[0].endpoints[0], new[0].endpoints[0]
        removed.inflight = current.inflight = 1
        waiting = asyncio.ensure_future(new[0].wait_for_slot(0.2))
        await asyncio.sleep(0.01)
        removed.inflight = 0
        removed.slot_freed()  # a request from before the reload ends
        await asyncio.sleep(0.01)
        current.inflight = 0
        current.slot_freed()
        assert await waiting is current

    asyncio.run(main())


def test_a_wait_ends_when_its_client_leaves_and_a_cancel_still_cancels() -> None:
    """`left` ends the wait (None, its place given up); cancelling the waiting task itself
    (a shutdown) still raises, and neither leaves a waiter in the queue."""

    async def main() -> None:
        tier = one_slot_tier()
        tier.endpoints[0].inflight = 1
        left: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(tier.wait_for_slot(5.0, left))
        await asyncio.sleep(0.01)
        left.set_result(None)
        assert await asyncio.wait_for(waiting, 1.0) is None and tier.queued == 0
        stays: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        cancelled = asyncio.ensure_future(tier.wait_for_slot(5.0, stays))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        assert cancelled.cancelled() and tier.queued == 0

    asyncio.run(main())
