"""Chooses the routing policy a configuration asks for (the composition root calls this)."""

from __future__ import annotations

from gateway.config import Settings
from gateway.routing.policy import RoutingPolicy


def build_policy(settings: Settings) -> RoutingPolicy:
    """The calibrated difficulty router, with the configured model or the shipped default."""
    from gateway.routing.router import RouterPolicy, Validation
    from router_models.labels import routing_proba
    from router_models.model import RouterModel, default_model_path
    from router_models.model_io import load_validation, model_checksum

    model_dir = settings.router.model_dir or default_model_path()
    model = RouterModel.load(model_dir)
    held_out = load_validation(model_dir)
    validation = None
    if held_out is not None:
        proba, correct = held_out
        validation = Validation(routing_proba(proba, model.label), correct)
    return RouterPolicy(model, settings, validation, model_id=model_checksum(model_dir))


__all__ = ["build_policy"]
