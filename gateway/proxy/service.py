"""Forwarding one OpenAI request: pick the tier, try endpoints, escalate, relay the answer.

The path reads top to bottom: resolve the model and any pin, ask the routing policy, then
walk the attempt plan (the chosen tier's endpoints, then the tiers above it) until one
answers with headers. Before that first byte reaches the client every failure is
retryable; after it, a failure ends the stream with an OpenAI-style error event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.backends.h1client import UpstreamResponse
from gateway.backends.tier import EndpointState, TierBackend
from gateway.config import ResilienceSettings, TimeoutSettings
from gateway.errors import (
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    TiergateError,
    UpstreamError,
)
from gateway.protocol import EndpointKind
from gateway.proxy.attempts import CLIENT_GONE, SATURATED, Attempter, AttemptFailed
from gateway.proxy.channel import ClientChannel
from gateway.proxy.departures import DepartureWatch
from gateway.proxy.events import ExchangeListener
from gateway.proxy.relay import Exchange
from gateway.routing.policy import Decision, RoutingPolicy
from gateway.stats import CompletedExchange, RequestRecord
from gateway.tenants.cache_salt import upstream_cache_salt
from gateway.tenants.registry import Tenant

PIN_SEPARATOR: Final = "@"
# How long a JSON request waits upstream before the gateway watches for its client leaving.
JSON_WATCH_DELAY_S: Final = 0.2


class _UpstreamRequests(list[UpstreamResponse]):
    """The upstream requests of one exchange. Once its client has left, every one is
    aborted, including one sent after the leaving was noticed (the h1client appends a
    response as soon as its request is sent)."""

    aborted = False  # a class default: one is built per request, without a Python __init__
    _left: asyncio.Future[None] | None = None  # built only for a request that queues

    def append(self, response: UpstreamResponse) -> None:
        super().append(response)
        if self.aborted:
            response.abort()

    def client_left(self) -> asyncio.Future[None]:
        """Done once the client has left: a queue wait ends then, not at its timeout."""
        if self._left is None:
            self._left = asyncio.get_running_loop().create_future()
            if self.aborted:
                self._left.set_result(None)
        return self._left

    def abort_all(self) -> None:
        # The client is gone: drop the upstream connections so the engine frees the slot.
        self.aborted = True
        if self._left is not None and not self._left.done():
            self._left.set_result(None)
        for response in self:
            response.abort()


@dataclass(slots=True)
class _Failures:
    """What went wrong so far, to pick the error the client finally gets, and the endpoints
    whose engine error awaits a verdict (`AttemptFailed.judged_later`)."""

    last: TiergateError | None = None
    saturated: int = 0
    other: int = 0
    suspects: list[EndpointState] = field(default_factory=list)

    def add(self, failure: AttemptFailed, endpoint: EndpointState) -> None:
        """Books a failed attempt; an engine error waits for a verdict (`served`, `acquit`)."""
        self.last = failure.error
        if failure.outcome == SATURATED:
            self.saturated += 1
            return
        self.other += 1
        if failure.judged_later:
            self.suspects.append(endpoint)

    @property
    def request_blamed(self) -> bool:
        """Every endpoint tried failed on this request with an engine error: the request, not
        the endpoints, is the likely cause (a poisoned request; no circuit counts it)."""
        return len(self.suspects) >= 2 and self.other == len(self.suspects)

    def served(self) -> None:
        """Another endpoint answered: the earlier engine errors were those endpoints' own."""
        for suspect in self.suspects:
            suspect.circuit.on_failure()
        self.suspects.clear()

    def acquit(self) -> None:
        """No endpoint served the request: no verdict on the suspects (it failed alike
        everywhere, or nothing else could be tried)."""
        for suspect in self.suspects:
            suspect.circuit.on_inconclusive()
        self.suspects.clear()

    @property
    def only_saturation(self) -> bool:
        return self.saturated > 0 and self.other == 0


def queue_tier(plan: list[TierBackend]) -> TierBackend | None:
    """Where a request waits when every eligible tier is full: the cheapest tier the gateway
    saw full, else (the engines answered 429/503) the cheapest with a usable endpoint. A
    tier with none is never freed a slot: a request queued there waited out queue_timeout_s
    for nothing."""
    return next((t for t in plan if t.saturated), None) or next((t for t in plan if t.usable), None)


class ProxyService:
    """Routes and forwards requests for one public model over a ladder of tiers."""

    def __init__(
        self,
        public_model: str,
        tiers: list[TierBackend],
        policy: RoutingPolicy,
        *,
        timeouts: TimeoutSettings,
        resilience: ResilienceSettings,
        listeners: Sequence[ExchangeListener] = (),
    ) -> None:
        self.public_model = public_model
        self.tiers = tiers
        self.policy = policy
        self.timeouts = timeouts
        self.resilience = resilience
        self._tier_by_name = {tier.name: tier for tier in tiers}
        self.listeners = tuple(listeners)
        self._attempter = Attempter(timeouts, public_model, self.listeners)
        self._departures = DepartureWatch(JSON_WATCH_DELAY_S)

    # -- routing --------------------------------------------------------------------------
    def pinned_tier(
        self, request: dict[str, Any], header_pin: str | None, tenant: Tenant
    ) -> int | None:
        """The tier a request pins (model suffix or header), validated; None when unpinned."""
        model = request.get("model")
        suffix_pin: str | None = None
        if model != self.public_model:
            base, sep, tier_name = str(model).partition(PIN_SEPARATOR)
            if not sep or base != self.public_model or not tier_name:
                raise NotFoundError(
                    f"The model '{model}' does not exist; use '{self.public_model}' or "
                    f"'{self.public_model}@<tier>'.",
                    param="model",
                    code="model_not_found",
                )
            suffix_pin = tier_name
        if suffix_pin and header_pin and suffix_pin != header_pin:
            # Both pins may name real tiers: the request contradicts itself (400), it does
            # not ask for something missing (404).
            raise InvalidRequestError(
                f"The model suffix pins tier '{suffix_pin}' but the x-tiergate-tier header "
                f"pins '{header_pin}'.",
                param="model",
                code="conflicting_pins",
            )
        pin = suffix_pin or header_pin
        if not pin:
            return None
        if not tenant.allow_pinning:
            raise PermissionDeniedError(f"Tenant '{tenant.name}' may not pin tiers.")
        tier = self._tier_by_name.get(pin)
        if tier is None:
            # Only the tiers this tenant may use: the others are not its business.
            usable = [self.tiers[i].name for i in tenant.allowed_tiers]
            raise NotFoundError(
                f"Unknown tier '{pin}'; your tiers are {usable}.",
                # A header pin is not a body parameter.
                param="model" if suffix_pin else None,
                code="tier_not_found",
            )
        if not tenant.allows(tier.index):
            raise PermissionDeniedError(f"Tenant '{tenant.name}' may not use tier '{pin}'.")
        return tier.index

    def decide(
        self, kind: EndpointKind, request: dict[str, Any], header_pin: str | None, tenant: Tenant
    ) -> Decision:
        pinned = self.pinned_tier(request, header_pin, tenant)
        if pinned is not None:
            return Decision(tier=pinned, probability=None, reason="pinned")
        return self.policy.decide(request, kind, tenant)

    def attempt_plan(self, decision: Decision, tenant: Tenant) -> list[TierBackend]:
        """The decided tier, then (unless pinned) every allowed tier above it, in order."""
        if decision.reason == "pinned":
            return [self.tiers[decision.tier]]
        return [self.tiers[i] for i in tenant.allowed_tiers if i >= decision.tier]

    # -- forwarding -----------------------------------------------------------------------
    async def handle(
        self,
        kind: EndpointKind,
        request: dict[str, Any],
        *,
        tenant: Tenant,
        header_pin: str | None,
        channel: ClientChannel,
        started: float,
        record: RequestRecord,
    ) -> None:
        """Serves one validated request end to end, filling `record`.

        Failures before the first byte raise a TiergateError for the handler to render.
        """
        record.stream = request.get("stream") is True
        decision = self.decide(kind, request, header_pin, tenant)
        record.decided_tier = decision.tier
        record.probability = decision.probability
        record.reason = decision.reason
        exchange = Exchange(kind, request, decision, channel, started, record)
        exchange.cache_salt = upstream_cache_salt(
            tenant.name, tenant.settings.isolate_prefix_cache, request.get("cache_salt")
        )
        if record.stream and kind != "responses":  # a Responses stream always ends in usage
            options = request.get("stream_options") or {}
            if not options.get("include_usage"):
                # Ask upstream for usage anyway (token metrics need it) and drop that extra
                # event before it reaches a client that did not ask for it. Usage on every
                # chunk stays off: vLLM ignores continuous_usage_stats without include_usage.
                upstream_options = {**options, "include_usage": True}
                upstream_options.pop("continuous_usage_stats", None)
                exchange.upstream_request = {**request, "stream_options": upstream_options}
                exchange.strip_usage = True
        if kind == "responses":
            # Nobody could fetch a stored response through the gateway (the next request may
            # go to another engine), and vLLM, when its store is on, never frees one.
            exchange.upstream_request = {**request, "store": False}
        # The replay and the shadow judges read chat and completions answers only.
        listeners = () if kind == "responses" else self.listeners
        wanted = [
            listener
            for listener in listeners
            if listener.wants_capture(tenant.name, decision.tier, request, kind)
        ]
        if wanted:
            exchange.captured = []
        # Read now: a reload during the exchange may swap the model that scored it.
        router_model = getattr(self.policy, "model_id", None) if wanted else None
        await self._forward(exchange, tenant)
        if wanted and record.status == 200 and not record.error_after_first_byte:
            assert record.served_tier is not None and exchange.captured is not None
            done = CompletedExchange(
                tenant=tenant.name,
                kind=kind,
                tier=exchange.tier_name,
                tier_index=record.served_tier,
                request=request,
                body=b"".join(exchange.captured),
                probability=exchange.served_probability(),
                probabilities=decision.probabilities,
                reason=record.reason,
                score=decision.score,
                request_id=record.request_id.decode(),
                ladder=record.ladder.names,
                request_bytes=record.request_bytes,
                router_model=router_model,
                cache_salt=exchange.cache_salt,
            )
            for listener in wanted:
                listener.exchange_done(done)

    async def _forward(self, exchange: Exchange, tenant: Tenant) -> None:
        current = _UpstreamRequests()
        abort_upstream = current.abort_all

        channel = exchange.channel
        if exchange.record.stream:
            # Streams can run for minutes: a client that leaves must free the engine slot at
            # once.
            channel.watch_disconnect(abort_upstream)
        else:
            self._departures.add(channel, abort_upstream)
        failures = _Failures()
        try:
            await self._serve(exchange, tenant, failures, current)
        finally:
            failures.acquit()
            self._departures.discard(channel)

    async def _serve(
        self,
        exchange: Exchange,
        tenant: Tenant,
        failures: _Failures,
        current: _UpstreamRequests,
    ) -> None:
        decision = exchange.decision
        plan = self.attempt_plan(decision, tenant)
        if await self._try_tiers(exchange, plan, failures, current):
            return
        if failures.only_saturation and tenant.settings.degrade_under_saturation:
            cheaper = self._degrade_plan(decision, tenant)
            if await self._try_tiers(exchange, cheaper, failures, current):
                exchange.record.reason = "degraded"
                return
        if failures.only_saturation and await self._queue(exchange, plan, failures, current):
            return
        if exchange.channel.disconnected:
            record = exchange.record
            record.client_disconnected = True
            record.status = 499
            # Left while an engine had the request: that tier began to serve and spent
            # tokens nobody metered (counted as unmetered, as a stream left is); left while
            # waiting in the gateway, no tier did.
            if record.attempts and record.attempts[-1].outcome == CLIENT_GONE:
                record.served_tier = record.attempts[-1].tier
            return
        if failures.only_saturation:
            raise RateLimitError(
                "Every eligible tier is saturated; retry after the indicated delay.",
                retry_after_s=self.resilience.retry_after_s,
                code="tiers_saturated",
            )
        if failures.last is None:
            raise ServiceUnavailableError(
                "No healthy endpoint is available for this request; try again shortly.",
                retry_after_s=self.resilience.retry_after_s,
            )
        if failures.request_blamed:
            raise UpstreamError(
                f"{failures.last.message} Every endpoint tried failed on this request alike "
                f"({len(failures.suspects)}); none is blamed for it.",
                retryable=False,
            )
        raise failures.last

    async def _try_tiers(
        self,
        exchange: Exchange,
        tiers: list[TierBackend],
        failures: _Failures,
        current: list[UpstreamResponse],
    ) -> bool:
        """Tries every available endpoint of each tier in order; True once one served."""
        run = self._attempter.run
        for tier in tiers:
            if tier.saturated:
                failures.saturated += 1
                continue
            tried: set[EndpointState] = set()
            while (endpoint := tier.pick(tried)) is not None:
                if exchange.channel.disconnected:
                    return False  # nobody is left to answer: send nothing more upstream
                tried.add(endpoint)
                try:
                    await run(exchange, tier, endpoint, current)
                except AttemptFailed as failure:
                    failures.add(failure, endpoint)
                    if exchange.channel.disconnected:
                        return False
                    if failure.final:
                        raise failure.error from None
                    continue
                failures.served()
                return True
        return False

    async def _queue(
        self,
        exchange: Exchange,
        plan: list[TierBackend],
        failures: _Failures,
        current: _UpstreamRequests,
    ) -> bool:
        """Every eligible tier is full: waits, briefly, in the bounded queue of `queue_tier`'s
        choice. True once served."""
        tier = queue_tier(plan)
        if tier is None:
            return False
        endpoint = await tier.wait_for_slot(self._queue_wait_s(exchange), current.client_left())
        if endpoint is None:
            return False
        if exchange.channel.disconnected:
            endpoint.slot_freed()  # its client left while it queued: the next waiter's
            return False
        if not endpoint.usable:
            # Ejected (or marked down) between the hand-over and now: sent anyway, its answer
            # would close the circuit without a half-open trial. Any other endpoint will do.
            endpoint.slot_freed()
            return await self._try_tiers(exchange, plan, failures, current)
        return await self._try(exchange, tier, endpoint, failures, current)

    async def _try(
        self,
        exchange: Exchange,
        tier: TierBackend,
        endpoint: EndpointState,
        failures: _Failures,
        current: list[UpstreamResponse],
    ) -> bool:
        try:
            await self._attempter.run(exchange, tier, endpoint, current)
        except AttemptFailed as failure:
            failures.add(failure, endpoint)
            if failure.final and not exchange.channel.disconnected:
                raise failure.error from None
            return False
        failures.served()
        return True

    def _queue_wait_s(self, exchange: Exchange) -> float:
        """queue_timeout_s, cut to what is left of the request's total_s: that bounds the
        whole request, queueing included."""
        left = self.timeouts.total_s - (time.perf_counter() - exchange.started)
        return min(self.resilience.queue_timeout_s, left)

    def _degrade_plan(self, decision: Decision, tenant: Tenant) -> list[TierBackend]:
        """Cheaper allowed tiers whose probability still reaches the tenant's floor."""
        probabilities = decision.probabilities
        if probabilities is None or decision.reason == "pinned":
            return []
        floor = tenant.settings.degrade_min_probability
        return [
            self.tiers[i]
            for i in reversed(tenant.allowed_tiers)
            if i < decision.tier and probabilities[i] >= floor
        ]


__all__ = ["PIN_SEPARATOR", "ProxyService", "queue_tier"]
