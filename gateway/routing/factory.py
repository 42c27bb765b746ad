"""Chooses the routing policy a configuration asks for (the composition root calls this)."""

from __future__ import annotations

from gateway.config import Settings
from gateway.routing.policy import RoutingPolicy, TopTierPolicy


def build_policy(settings: Settings) -> RoutingPolicy:
    """Until the difficulty router lands: everything to the top tier."""
    return TopTierPolicy()


__all__ = ["build_policy"]
