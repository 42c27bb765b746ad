"""The admin API: separate token, never a tenant key; read-only views and a reload.

Routes: GET /admin/config (keys masked), GET /admin/backends, GET /admin/tenants,
POST /admin/reload, GET /admin/regime (observed regime per tier), GET /admin/plan (the
planner's recommendation, running flags and drift).
Disabled (403) until an admin token is configured.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.api.routes import bearer_matches, error_response
from gateway.errors import AuthenticationError, InvalidRequestError, PermissionDeniedError
from gateway.workers import reload_sibling_workers

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.routing.router import TenantRouting

Handler = Callable[[Request], Awaitable[Response]]


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def require_admin(handler: Callable[[Request, Gateway], Awaitable[Any]]) -> Handler:
    """Wraps a handler: checks the admin token in constant time, renders JSON."""

    async def wrapped(request: Request) -> Response:
        gateway = _gateway(request)
        token = gateway.runtime.admin_token
        if not token:
            variable = gateway.runtime.settings.admin.token_env
            where = f"admin.token or ${variable}" if variable else "admin.token"
            return error_response(PermissionDeniedError(f"The admin API is disabled: set {where}."))
        if not bearer_matches(request, token):
            return error_response(AuthenticationError("A valid admin token is required."))
        result = await handler(request, gateway)
        return result if isinstance(result, Response) else JSONResponse(result)

    return wrapped


async def config(request: Request, gateway: Gateway) -> Any:
    # SecretStr renders keys as "**********"; admin tokens are not part of the dump.
    return gateway.runtime.settings.model_dump(
        mode="json", exclude={"admin": True, "metrics": {"token"}}
    )


async def backends(request: Request, gateway: Gateway) -> Any:
    return {
        tier.name: [
            {
                "endpoint": state.url,
                "healthy": state.healthy,
                "health_error": state.health_error,
                "circuit": state.circuit_state.name.lower(),
                "inflight": state.inflight,
                "consecutive_failures": state.circuit.consecutive_failures,
            }
            for state in tier.endpoints
        ]
        for tier in gateway.runtime.tiers
    }


async def tenants(request: Request, gateway: Gateway) -> Any:
    runtime = gateway.runtime
    names = [tier.name for tier in runtime.settings.tiers]
    return {
        name: {
            "allowed_tiers": [names[i] for i in tenant.allowed_tiers],
            "allow_pinning": tenant.allow_pinning,
            "inflight": gateway.admission.inflight.get(name, 0),
            "limits": tenant.settings.limits.model_dump(),
            "routing": routing_view(runtime.policy, name, names),
        }
        for name, tenant in runtime.tenants.tenants.items()
    }


def routing_view(policy: object, tenant: str, names: list[str]) -> dict[str, Any] | None:
    """A tenant's thresholds, where they came from, whether tuned routing beats the uniform
    floor tier on validation, and Paper A's pre-test (router only)."""
    from gateway.routing.router import RouterPolicy

    if not isinstance(policy, RouterPolicy) or tenant not in policy.routing:
        return None
    routing = policy.routing[tenant]
    floor = routing.uniform_floor_tier
    return {
        "thresholds": dict(zip(names[:-1], routing.thresholds, strict=True)),
        "source": routing.source,
        "routing_pays": routing.routing_pays,
        "uniform_floor_tier": None if floor is None else names[floor],
        "pretest": _pretest_view(routing),
        "recalibrated": tenant in policy.tenant_models,
    }


def _pretest_view(routing: TenantRouting) -> dict[str, Any] | None:
    if routing.pretest_pays is None:
        return None
    return {"routing_pays": routing.pretest_pays, "message": routing.pretest}


async def reload(request: Request, gateway: Gateway) -> Any:
    if gateway.config_path is None:
        message = "this gateway was not started from a config file"
        return error_response(InvalidRequestError(f"Reload refused: {message}"))
    refused = gateway.try_reload()
    if refused is not None:
        return error_response(
            InvalidRequestError(f"Reload refused, the running config stays: {refused}")
        )
    if reload_sibling_workers():  # under `serve --workers N`, the other workers too
        gateway.expect_reload_echo()
    # Applied, except what waits for a restart (also logged): the caller sees it too.
    return {
        "reloaded": True,
        "reloads": gateway.reloads,
        "restart_needed": list(gateway.restart_needed),
    }


async def regime(request: Request, gateway: Gateway) -> Any:
    """The observed regime per tier (the shape `tiergate plan --from-gateway` reads)."""
    return gateway.observer.regime_view()


async def plan(request: Request, gateway: Gateway) -> Any:
    """The planner's latest recommendation per tier, the running flags and their drift.

    `?refresh=1` evaluates now instead of waiting for the next planning period.
    """
    if request.query_params.get("refresh"):
        gateway.observer.plan_once()
    return {"tiers": gateway.observer.plan_view()}


async def shadow(request: Request, gateway: Gateway) -> Any:
    """Shadow evaluation per tenant and tier: labels, predicted and observed adequacy."""
    return {"tenants": gateway.shadow.view(), "inflight": gateway.shadow.inflight}


def routes() -> list[Route]:
    return [
        Route("/admin/config", require_admin(config), methods=["GET"]),
        Route("/admin/backends", require_admin(backends), methods=["GET"]),
        Route("/admin/tenants", require_admin(tenants), methods=["GET"]),
        Route("/admin/reload", require_admin(reload), methods=["POST"]),
        Route("/admin/regime", require_admin(regime), methods=["GET"]),
        Route("/admin/plan", require_admin(plan), methods=["GET"]),
        Route("/admin/shadow", require_admin(shadow), methods=["GET"]),
    ]


__all__ = ["require_admin", "routes"]
