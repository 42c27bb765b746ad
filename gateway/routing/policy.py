"""The one interface between request handling and routing: request in, decision out.

Handlers and the proxy only ever call `RoutingPolicy.decide`; what stands behind it (the
calibrated difficulty router, or the placeholder here) is chosen in the composition root.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from gateway.protocol import EndpointKind
from gateway.tenants.registry import Tenant


class Decision(NamedTuple):
    """Which ladder tier serves a request, and why (a NamedTuple: built on every request)."""

    tier: int
    probability: float | None  # calibrated P(chosen tier adequate); None when not computed
    reason: str  # "router", "threshold-fallback", "pinned", "uniform-baseline", ...
    # P(adequate) for every ladder tier, when the policy computed them (degrading under
    # saturation needs the cheaper tiers' probabilities).
    probabilities: tuple[float, ...] | None = None
    score: float | None = None  # the router's raw difficulty score (what calibrators consume)


class RoutingPolicy(Protocol):
    def decide(self, request: Mapping[str, Any], kind: EndpointKind, tenant: Tenant) -> Decision:
        """Chooses a tier among `tenant.allowed_tiers`; pure, never does I/O."""
        ...


class TopTierPolicy:
    """Sends everything to the most precise tier the tenant may use (the safe baseline)."""

    def decide(self, request: Mapping[str, Any], kind: EndpointKind, tenant: Tenant) -> Decision:
        return Decision(tier=tenant.top_tier, probability=None, reason="top-tier")


__all__ = ["Decision", "RoutingPolicy", "TopTierPolicy"]
