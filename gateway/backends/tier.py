"""Upstream endpoints grouped by ladder tier: pools, health, circuit state, slot queue."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.backends.circuit import CircuitBreaker, CircuitState
from gateway.backends.h1client import ConnectionPool
from gateway.backends.tls import tier_tls_context
from gateway.config import Endpoint, ResilienceSettings, Settings, TierSettings, tier_api_key
from gateway.protocol import EndpointKind


@dataclass(slots=True, eq=False)
class EndpointState:
    """One upstream base URL of a tier: its connection pool and live counters."""

    tier: str
    endpoint: Endpoint
    pool: ConnectionPool
    max_inflight: int
    circuit: CircuitBreaker = field(default_factory=CircuitBreaker)
    inflight: int = 0
    # Slots handed to queued requests that have not resumed yet: counted as taken, or a new
    # request running first in the same loop turn takes the slot too (past max_inflight).
    reserved: int = 0
    healthy: bool = True
    health_error: str | None = None  # why the last health check failed
    # The upstream path per endpoint kind, rendered once.
    paths: dict[EndpointKind, bytes] = field(default_factory=dict)
    # The tier this endpoint serves in the running configuration. A reload builds new tiers
    # and keeps unchanged endpoints: a slot freed by a request from before it must wake the
    # requests queued on the new tier, not on the old one nobody waits on any more.
    owner: TierBackend | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        base = self.endpoint.base_path
        self.paths = {
            "chat": f"{base}/chat/completions".encode(),
            "completions": f"{base}/completions".encode(),
            "responses": f"{base}/responses".encode(),
        }

    @property
    def url(self) -> str:
        return self.endpoint.url

    def slot_freed(self) -> None:
        """A request on this endpoint finished: its tier may hand the slot to a waiter."""
        if self.owner is not None:
            self.owner.slot_freed()

    @property
    def saturated(self) -> bool:
        return self.inflight + self.reserved >= self.max_inflight

    @property
    def usable(self) -> bool:
        """Healthy and not ejected; it may still be saturated."""
        return self.healthy and self.circuit.can_send()

    @property
    def available(self) -> bool:
        return self.usable and not self.saturated

    @property
    def circuit_state(self) -> CircuitState:
        return self.circuit.observed_state


@dataclass(slots=True, eq=False)
class TierBackend:
    """A ladder tier: its endpoints and a bounded queue of requests waiting for a slot."""

    index: int
    name: str
    settings: TierSettings
    served_model_name: str
    queue_size: int = 256
    endpoints: list[EndpointState] = field(default_factory=list)
    # Pre-rendered header lines sent on every upstream call (the tier's API key).
    upstream_headers: bytes = field(default=b"", repr=False)  # holds a secret
    # The TLS context of the tier's https endpoints (None: it has none).
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    # The circuit breakers' thresholds and the connect timeout its endpoints get on adoption.
    resilience: ResilienceSettings = field(default_factory=ResilienceSettings, repr=False)
    connect_timeout_s: float = 3.0
    _waiters: deque[asyncio.Future[EndpointState]] = field(default_factory=deque)
    # The tier that replaced this one in a reload (`take_queue`): it hands out the slots.
    successor: TierBackend | None = field(default=None, repr=False)

    def adopt_endpoints(self) -> None:
        """Makes this tier's settings those of its endpoints, kept ones from the previous
        configuration included. Called when the configuration is installed, never while it
        is built: a reload refused after `build_tiers` must leave the running endpoints as
        they were (their slot queue, limit and key)."""
        for state in self.endpoints:
            self.adopt(state)

    def adopt(self, state: EndpointState) -> None:
        """What the tier's settings make of one endpoint: its slot queue, limit, key, TLS,
        circuit thresholds and connect timeout (a kept endpoint keeps its circuit's state, not
        the thresholds of the configuration it was built under)."""
        state.owner = self
        state.tier = self.name  # a renamed tier keeps its engine's endpoint (build_tiers)
        state.max_inflight = self.settings.max_inflight_per_endpoint
        state.pool.default_headers = self.upstream_headers
        state.pool.tls = self.tls if state.endpoint.scheme == "https" else None
        state.pool.connect_timeout_s = self.connect_timeout_s
        circuit, resilience = state.circuit, self.resilience
        circuit.failure_threshold = resilience.failure_threshold
        circuit.base_ejection_s = resilience.base_ejection_s
        circuit.max_ejection_s = resilience.max_ejection_s

    def pick(
        self, exclude: set[EndpointState] | frozenset[EndpointState] = frozenset()
    ) -> EndpointState | None:
        """The least-loaded available endpoint not in `exclude` (ties: config order)."""
        best: EndpointState | None = None
        for state in self.endpoints:
            if state in exclude or not state.available:
                continue
            if best is None or state.inflight < best.inflight:
                best = state
        return best

    @property
    def saturated(self) -> bool:
        """Every usable endpoint is full (and at least one is usable)."""
        any_usable = False
        for state in self.endpoints:
            if state.usable:
                if not state.saturated:
                    return False
                any_usable = True
        return any_usable

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def wait_for_slot(
        self, timeout_s: float, left: asyncio.Future[None] | None = None
    ) -> EndpointState | None:
        """Waits in the tier's bounded queue; None when it is full, the wait times out or
        `left` is done (its client has gone: its place and its tenant's slot are not held
        for nobody until the timeout). A tier a reload replaced queues the request where its
        slots are handed out now: its heir's queue."""
        queue = self.heir()
        if len(queue._waiters) >= queue.queue_size or timeout_s <= 0:
            return None
        waiter: asyncio.Future[EndpointState] = asyncio.get_running_loop().create_future()
        queue._waiters.append(waiter)

        def stop_waiting(_: asyncio.Future[None]) -> None:
            waiter.cancel()  # a waiter already handed its slot keeps it: `_queue` passes it on

        if left is not None:
            left.add_done_callback(stop_waiting)
        try:
            async with asyncio.timeout(timeout_s):
                state = await waiter
            # Resumed: the caller sends on this slot before it next yields to the loop.
            state.reserved -= 1
            return state
        except TimeoutError:
            self._pass_on(waiter)
            return None
        except asyncio.CancelledError:
            self._pass_on(waiter)
            task = asyncio.current_task()
            if left is not None and left.done() and task is not None and not task.cancelling():
                return None  # only the wait was cancelled, by `stop_waiting`
            raise
        finally:
            if left is not None:
                left.remove_done_callback(stop_waiting)
            waiters = self.heir()._waiters  # a reload during the wait may have moved it
            if waiter in waiters:
                waiters.remove(waiter)

    def _pass_on(self, waiter: asyncio.Future[EndpointState]) -> None:
        """A wait that ended (timeout, cancel) in the loop turn its slot was handed over: the
        slot goes to the next waiter, or it stays free with the rest queued behind it."""
        if waiter.done() and not waiter.cancelled():
            waiter.result().reserved -= 1
            self.slot_freed()

    def take_queue(self, replaced: TierBackend) -> None:
        """Requests queued on the tier this one replaces (a reload) wait on this one: the
        slots their endpoints free wake this tier's queue now, so theirs would never be
        woken again. One deque for both, so a wait that ends leaves it either way."""
        self._waiters = replaced._waiters
        replaced.successor = self

    def join_queue(self, merged: TierBackend) -> None:
        """Requests queued on a tier merged into this one (a reload) queue behind this one's
        own: the slots their endpoints free wake this tier's queue now. They are moved, not
        copied: the tiers `merged` replaced earlier still hold its old queue, and a waiter
        left there too would stay counted here after its wait ended."""
        if merged._waiters is not self._waiters:
            self._waiters.extend(merged._waiters)
            merged._waiters.clear()
        merged._waiters = self._waiters
        merged.successor = self

    def heir(self) -> TierBackend:
        """The tier that hands out this one's slots now: itself, or the last of the tiers
        reloads replaced it with (`take_queue`, `join_queue`)."""
        tier = self
        while tier.successor is not None:
            tier = tier.successor
        return tier

    def slot_freed(self) -> None:
        """A request on this tier finished: hand its slot to the first waiter, if any."""
        if self.successor is not None:
            # Replaced: its queue is the successor's now, and so are the endpoints a waiter may
            # be handed (one the reload removed must not serve a request queued since).
            self.successor.slot_freed()
            return
        while self._waiters:
            state = self.pick()
            if state is None:
                return
            waiter = self._waiters.popleft()
            if not waiter.done():
                state.reserved += 1
                waiter.set_result(state)
                return

    def hand_out_free_slots(self) -> None:
        """Hands every free slot to a waiter. Only a request's end frees a slot otherwise: the
        room a reload adds (a new endpoint, a higher limit) would leave the requests queued
        before it waiting for one to end, or out their queue_timeout_s, for a 429."""
        queued = -1
        while self._waiters and len(self._waiters) != queued:
            queued = len(self._waiters)
            self.slot_freed()  # takes a waiter from the queue, or none when no slot is free

    @property
    def healthy(self) -> bool:
        return any(state.healthy for state in self.endpoints)

    @property
    def usable(self) -> bool:
        """Some endpoint passes its health checks and is not ejected by its circuit."""
        return any(state.usable for state in self.endpoints)

    def close(self) -> None:
        for state in self.endpoints:
            state.pool.close()


def build_tiers(
    settings: Settings,
    previous: Mapping[tuple[str, str], EndpointState] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[TierBackend]:
    """Tier backends for `settings`; endpoints unchanged since `previous` keep their pool,
    health and circuit state (a reload must not drop warm connections or forget an outage).
    Kept endpoints are not changed here: `TierBackend.adopt_endpoints` does that on install.
    Raises ConfigError for a tier key or CA file that cannot be used."""
    resilience: ResilienceSettings = settings.resilience
    previous = previous or {}
    names = {tier.name for tier in settings.tiers}
    kept_ids: set[int] = set()
    tiers = []
    for index, tier in enumerate(settings.tiers):
        key = tier_api_key(tier, environ)
        backend = TierBackend(
            index=index,
            name=tier.name,
            settings=tier,
            served_model_name=tier.served_model_name or settings.model,
            queue_size=resilience.queue_size,
            upstream_headers=b"" if key is None else f"authorization: Bearer {key}\r\n".encode(),
            tls=tier_tls_context(tier),
            resilience=resilience,
            connect_timeout_s=settings.timeouts.connect_s,
        )
        for endpoint in tier.parsed_endpoints:
            # Kept by its tier, or by the URL alone when its tier was renamed: a fresh state
            # would count none of the requests the engine is still running (past its limit).
            # By tier first: an engine standing in for two tiers has a state in each.
            kept = previous.get((tier.name, endpoint.url)) or next(
                (
                    state
                    for (owner, url), state in previous.items()
                    if url == endpoint.url and owner not in names and id(state) not in kept_ids
                ),
                None,
            )
            if kept is not None and id(kept) not in kept_ids:
                kept_ids.add(id(kept))
                backend.endpoints.append(kept)
                continue
            state = EndpointState(
                tier=tier.name,
                endpoint=endpoint,
                pool=ConnectionPool(
                    endpoint.host, endpoint.port, connect_timeout_s=settings.timeouts.connect_s
                ),
                max_inflight=tier.max_inflight_per_endpoint,
                circuit=CircuitBreaker(
                    failure_threshold=resilience.failure_threshold,
                    base_ejection_s=resilience.base_ejection_s,
                    max_ejection_s=resilience.max_ejection_s,
                ),
            )
            backend.adopt(state)  # new: nothing running depends on it yet
            backend.endpoints.append(state)
        tiers.append(backend)
    return tiers


def served_name(tier: TierBackend, endpoint: EndpointState) -> str:
    """The model name to send `endpoint`: its tier's in the running configuration. A request
    that picked it from a tier a reload has since replaced (queued, failing over, a shadow
    replay) goes out under the name its engine serves now."""
    return (endpoint.owner or tier).served_model_name


def endpoints_by_url(tiers: list[TierBackend]) -> dict[tuple[str, str], EndpointState]:
    """The running endpoint states by (tier, URL), for a reload to keep."""
    return {(tier.name, state.url): state for tier in tiers for state in tier.endpoints}


__all__ = ["EndpointState", "TierBackend", "build_tiers", "endpoints_by_url"]
