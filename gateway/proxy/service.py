"""Forwarding one OpenAI request: pick the tier, try endpoints, escalate, relay the answer.

The path reads top to bottom: resolve the model and any pin, ask the routing policy, then
walk the attempt plan (the chosen tier's endpoints, then the tiers above it) until one
answers with headers. Before that first byte reaches the client every failure is
retryable; after it, a failure ends the stream with an OpenAI-style error event.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Final

import orjson

from gateway.backends.h1client import (
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamResponse,
    UpstreamTimeout,
)
from gateway.backends.tier import EndpointState, TierBackend
from gateway.config import TimeoutSettings
from gateway.errors import (
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    TiergateError,
    UpstreamError,
    UpstreamTimeoutError,
)
from gateway.protocol import EndpointKind
from gateway.proxy.channel import ClientChannel
from gateway.proxy.relay import Exchange, relay_body, relay_stream
from gateway.proxy.rewrite import ModelRewriter
from gateway.routing.policy import Decision, RoutingPolicy
from gateway.stats import Attempt, RequestRecord
from gateway.tenants.registry import Tenant

PIN_SEPARATOR: Final = "@"
# Upstream statuses that are the client's own mistake: relayed as they are, never retried.
_CLIENT_ERRORS: Final = frozenset({400, 413, 422})
_SATURATED: Final = frozenset({429, 503})


class _AttemptFailed(Exception):
    def __init__(self, outcome: str, error: TiergateError) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.error = error


class ProxyService:
    """Routes and forwards requests for one public model over a ladder of tiers."""

    def __init__(
        self,
        public_model: str,
        tiers: list[TierBackend],
        policy: RoutingPolicy,
        timeouts: TimeoutSettings,
    ) -> None:
        self.public_model = public_model
        self.tiers = tiers
        self.policy = policy
        self.timeouts = timeouts
        self._tier_by_name = {tier.name: tier for tier in tiers}
        self._rewriters = [ModelRewriter(tier.served_model_name, public_model) for tier in tiers]

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
            raise NotFoundError(
                f"The model suffix pins tier '{suffix_pin}' but the x-tiergate-tier header "
                f"pins '{header_pin}'.",
                param="model",
            )
        pin = suffix_pin or header_pin
        if not pin:
            return None
        tier = self._tier_by_name.get(pin)
        if tier is None:
            raise NotFoundError(
                f"Unknown tier '{pin}'; tiers are {[t.name for t in self.tiers]}.",
                param="model",
                code="tier_not_found",
            )
        if not tenant.allow_pinning:
            raise PermissionDeniedError(f"Tenant '{tenant.name}' may not pin tiers.")
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
        if record.stream:
            options = request.get("stream_options") or {}
            if not options.get("include_usage"):
                # Ask upstream for usage anyway (token metrics need it) and drop that extra
                # event before it reaches a client that did not ask for it.
                exchange.upstream_request = {
                    **request,
                    "stream_options": {**options, "include_usage": True},
                }
                exchange.strip_usage = True
        await self._forward(exchange, tenant)

    async def _forward(self, exchange: Exchange, tenant: Tenant) -> None:
        current: list[UpstreamResponse] = []

        def abort_upstream() -> None:
            # The client is gone: drop the upstream connection so the engine frees the slot.
            for response in current:
                response.abort()

        exchange.channel.watch_disconnect(abort_upstream)
        record = exchange.record
        last_error: TiergateError | None = None
        all_saturated = True
        for tier, endpoint in self._candidates(exchange.decision, tenant):
            asked = time.perf_counter()
            endpoint.inflight += 1
            try:
                response = await self._send(exchange, tier, endpoint)
            except _AttemptFailed as failure:
                endpoint.inflight -= 1
                exchange.waited += time.perf_counter() - asked
                record.attempts.append(Attempt(tier.index, endpoint.url, failure.outcome))
                all_saturated = all_saturated and failure.outcome == "saturated"
                last_error = failure.error
                if exchange.channel.disconnected:
                    record.client_disconnected = True
                    record.status = 499
                    return
                continue
            exchange.waited += time.perf_counter() - asked
            current.append(response)
            record.attempts.append(Attempt(tier.index, endpoint.url, "ok"))
            record.served_tier = tier.index
            record.status = response.status
            exchange.tier_name = tier.name
            exchange.rewrite = self._rewriters[tier.index]
            try:
                if record.stream and response.status == 200:
                    await relay_stream(exchange, response)
                else:
                    await relay_body(exchange, response)
            finally:
                endpoint.inflight -= 1
                response.release()
            return

        if last_error is None:
            raise ServiceUnavailableError(
                "No healthy endpoint is available for this request; try again shortly."
            )
        if all_saturated:
            raise RateLimitError(
                "Every eligible tier is saturated; retry after the indicated delay.",
                retry_after_s=1.0,
                code="tiers_saturated",
            )
        raise last_error

    def _candidates(
        self, decision: Decision, tenant: Tenant
    ) -> Iterator[tuple[TierBackend, EndpointState]]:
        for tier in self.attempt_plan(decision, tenant):
            tried: set[EndpointState] = set()
            while (endpoint := tier.pick(tried)) is not None:
                tried.add(endpoint)
                yield tier, endpoint

    async def _send(
        self, exchange: Exchange, tier: TierBackend, endpoint: EndpointState
    ) -> UpstreamResponse:
        """One attempt up to the response headers; classifies every failure."""
        body = orjson.dumps({**exchange.upstream_request, "model": tier.served_model_name})
        path = endpoint.chat_path if exchange.kind == "chat" else endpoint.completions_path
        request = endpoint.pool.render(b"POST", path, body)
        try:
            response = await endpoint.pool.request(
                request,
                first_byte_timeout_s=self.timeouts.first_byte_s,
                total_timeout_s=self.timeouts.total_s,
            )
        except UpstreamTimeout as exc:
            raise _AttemptFailed(
                "timeout", UpstreamTimeoutError(f"Upstream timed out: {exc}")
            ) from None
        except UpstreamConnectError as exc:
            raise _AttemptFailed(
                "connect_error", UpstreamError(f"Upstream unreachable: {exc}")
            ) from None
        except UpstreamProtocolError as exc:
            raise _AttemptFailed(
                "protocol_error", UpstreamError(f"Upstream failed: {exc}")
            ) from None
        status = response.status
        if status < 400 or status in _CLIENT_ERRORS:
            return response
        response.abort()
        if status in _SATURATED:
            raise _AttemptFailed(
                "saturated", ServiceUnavailableError(f"Upstream is saturated (HTTP {status}).")
            )
        outcome = "status_5xx" if status >= 500 else "status_4xx"
        raise _AttemptFailed(outcome, UpstreamError(f"Upstream answered HTTP {status}."))


__all__ = ["PIN_SEPARATOR", "ProxyService"]
