"""Chooses the routing policy a configuration asks for (the composition root calls this)."""

from __future__ import annotations

from gateway.config import Settings
from gateway.routing.policy import RoutingPolicy


def build_policy(settings: Settings) -> RoutingPolicy:
    """The calibrated difficulty router, with the configured model or the shipped default."""
    from gateway.routing.router import RouterPolicy
    from router_models.model import RouterModel, default_model_path

    model_dir = settings.router.model_dir or default_model_path()
    return RouterPolicy(RouterModel.load(model_dir), settings)


__all__ = ["build_policy"]
