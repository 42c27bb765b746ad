"""Active health checks: GET <root>/health on every endpoint, on a fixed period."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from gateway.backends.h1client import UpstreamFailure
from gateway.backends.tier import EndpointState, TierBackend
from gateway.periods import sleep_period

log = logging.getLogger("tiergate.health")


def health_path(state: EndpointState) -> bytes:
    """vLLM serves /health at the root, beside /v1."""
    base = state.endpoint.base_path
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    return f"{root}/health".encode()


async def probe(state: EndpointState, timeout_s: float) -> str | None:
    """None when the endpoint is healthy, else why not (for the log and /admin/backends)."""
    request = state.pool.render(b"GET", health_path(state), b"")
    try:
        response = await state.pool.request(
            request, first_byte_timeout_s=timeout_s, total_timeout_s=timeout_s
        )
    except UpstreamFailure as exc:
        return str(exc)
    try:
        await response.read(64 * 1024)
    except UpstreamFailure as exc:
        return str(exc)
    finally:
        response.release()
    return None if response.status == 200 else f"/health answered HTTP {response.status}"


class HealthChecker:
    """Marks endpoints healthy or not; reads the current tiers on every round (reloads)."""

    def __init__(
        self,
        tiers: Callable[[], Sequence[TierBackend]],
        interval_s: float = 2.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.tiers = tiers
        self.interval_s = interval_s
        self.timeout_s = timeout_s

    async def check_once(self) -> None:
        states = [state for tier in self.tiers() for state in tier.endpoints]
        results = await asyncio.gather(*(probe(state, self.timeout_s) for state in states))
        for state, error in zip(states, results, strict=True):
            ok = error is None
            if ok != state.healthy or error != state.health_error:
                log.warning(
                    "endpoint %s of tier %s is %s",
                    state.url,
                    state.tier,
                    "up" if ok else f"down: {error}",
                )
            state.healthy = ok
            state.health_error = error

    async def run(self) -> None:
        while True:
            await self.check_once()
            await sleep_period(lambda: self.interval_s)  # a reload may change it meanwhile


__all__ = ["HealthChecker", "health_path", "probe"]
