"""Admission per tenant: body and max_tokens caps, then rate, token and concurrency limits.

Limiters outlive configuration reloads (a reload must not hand every tenant a fresh burst);
`configure` keeps a tenant's limiter while its limits are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequestError
from gateway.tenants.limits import TenantLimiter, TenantLimits, estimate_tokens
from gateway.tenants.registry import Tenant


@dataclass(slots=True)
class Ticket:
    """An admitted request's hold on its tenant's limits; give it back with `release`."""

    limiter: TenantLimiter
    estimate: int

    def release(self, used_tokens: int | None) -> None:
        self.limiter.release(self.estimate, used_tokens)


class Admission:
    def __init__(self) -> None:
        self._limiters: dict[str, TenantLimiter] = {}

    def configure(self, tenants: Mapping[str, Tenant]) -> None:
        limiters = {}
        for name, tenant in tenants.items():
            settings = tenant.settings.limits
            limits = TenantLimits(
                requests_per_second=settings.requests_per_second,
                burst=settings.burst,
                tokens_per_minute=settings.tokens_per_minute,
                max_concurrency=settings.max_concurrency,
            )
            kept = self._limiters.get(name)
            limiters[name] = (
                kept if kept is not None and kept.limits == limits else TenantLimiter(limits)
            )
        self._limiters = limiters

    def limiter(self, tenant: Tenant) -> TenantLimiter:
        limiter = self._limiters.get(tenant.name)
        if limiter is None:
            limiter = self._limiters[tenant.name] = TenantLimiter(TenantLimits())
        return limiter

    @staticmethod
    def body_limit(tenant: Tenant, gateway_limit: int) -> int:
        own = tenant.settings.limits.max_body_bytes
        return gateway_limit if own is None else min(own, gateway_limit)

    def admit(self, tenant: Tenant, request: dict[str, Any], body_bytes: int) -> Ticket:
        """Applies the tenant's max_tokens cap (may set max_tokens), then its limits."""
        cap = tenant.settings.limits.max_tokens
        asked = request.get("max_completion_tokens") or request.get("max_tokens")
        if cap is not None:
            if asked is None:
                # Without a cap the engine may generate up to the context length.
                request["max_tokens"] = asked = cap
            elif asked > cap:
                field = (
                    "max_completion_tokens" if "max_completion_tokens" in request else "max_tokens"
                )
                raise InvalidRequestError(
                    f"{field} is {asked}; this key may ask for at most {cap}.",
                    param=field,
                    code="max_tokens_exceeded",
                )
        choices = request.get("n") or 1
        estimate = estimate_tokens(body_bytes, None if asked is None else asked * choices)
        limiter = self.limiter(tenant)
        limiter.admit(estimate)
        return Ticket(limiter, estimate)


__all__ = ["Admission", "Ticket"]
