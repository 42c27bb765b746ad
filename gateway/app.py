"""The composition root: `build_app(settings)` creates every long-lived object.

Nothing here runs at import time. Objects derived from the configuration live in a
`GatewayRuntime`, which a reload replaces as one reference swap; requests in flight keep
the runtime they started with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api import routes
from gateway.api.openai import GenerationHandler
from gateway.backends.health import HealthChecker
from gateway.backends.tier import EndpointState, TierBackend, build_tiers
from gateway.config import Settings
from gateway.errors import InvalidRequestError, MethodNotAllowedError, NotFoundError
from gateway.metrics import GatewayMetrics
from gateway.proxy.channel import Receive, Send
from gateway.proxy.service import ProxyService
from gateway.routing.policy import RoutingPolicy, TopTierPolicy
from gateway.tenants.registry import TenantRegistry

log = logging.getLogger("tiergate")

PolicyFactory = Callable[[Settings], RoutingPolicy]


@dataclass(slots=True)
class GatewayRuntime:
    """Everything derived from one configuration."""

    settings: Settings
    tenants: TenantRegistry
    tiers: list[TierBackend]
    service: ProxyService
    hot_routes: dict[str, GenerationHandler]

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()


class Gateway:
    """The ASGI application: hot generation routes on raw ASGI, the rest on Starlette."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        environ: Mapping[str, str] | None = None,
        policy_factory: PolicyFactory | None = None,
        health_interval_s: float = 2.0,
    ) -> None:
        # `_created` series double every counter's cardinality and no dashboard reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        self.environ = environ
        self.policy_factory: PolicyFactory = policy_factory or (lambda _settings: TopTierPolicy())
        self.health_interval_s = health_interval_s
        self.metrics = GatewayMetrics(
            self.registry,
            [tier.name for tier in settings.tiers],
            [tier.relative_cost for tier in settings.tiers],
        )
        self.draining = False
        self._tasks: list[asyncio.Task[None]] = []
        self.runtime = self._build_runtime(settings)
        self._fallback = self._build_fallback()

    # -- construction ---------------------------------------------------------------------
    def _build_runtime(self, settings: Settings) -> GatewayRuntime:
        tenants = TenantRegistry(settings, self.environ)
        tiers = build_tiers(settings)
        service = ProxyService(
            settings.model, tiers, self.policy_factory(settings), settings.timeouts
        )
        hot_routes = {
            "/v1/chat/completions": GenerationHandler(
                "chat", tenants, service, settings.limits, self.metrics
            ),
            "/v1/completions": GenerationHandler(
                "completions", tenants, service, settings.limits, self.metrics
            ),
        }
        for tier in tiers:
            for state in tier.endpoints:
                self.metrics.set_backend_up(tier.name, state.url, state.healthy)
        return GatewayRuntime(settings, tenants, tiers, service, hot_routes)

    def _build_fallback(self) -> Starlette:
        app = Starlette(
            routes=[
                Route("/v1/models", routes.list_models, methods=["GET"]),
                Route("/health", routes.health, methods=["GET"]),
                Route("/ready", routes.ready, methods=["GET"]),
                Route("/metrics", routes.metrics, methods=["GET"]),
                Route("/openapi.json", routes.openapi, methods=["GET"]),
            ],
            exception_handlers={HTTPException: _http_exception},
            lifespan=self._lifespan,
        )
        app.state.gateway = self
        return app

    # -- ASGI -----------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.runtime.hot_routes.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        await self._fallback(scope, receive, send)  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def start(self) -> None:
        checker = HealthChecker(
            self.runtime.tiers, self._on_health_change, interval_s=self.health_interval_s
        )
        await checker.check_once()
        self._tasks.append(asyncio.get_running_loop().create_task(checker.run()))

    async def stop(self) -> None:
        self.draining = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.runtime.close()

    def _on_health_change(self, state: EndpointState, up: bool) -> None:
        self.metrics.set_backend_up(state.tier, state.url, up)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: InvalidRequestError
    if exc.status_code == 405:
        error = MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}.")
    elif exc.status_code == 404:
        error = NotFoundError(f"No route for {request.url.path}.")
    else:
        error = InvalidRequestError(exc.detail)
    return routes.error_response(error)


def build_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    environ: Mapping[str, str] | None = None,
    policy_factory: PolicyFactory | None = None,
    health_interval_s: float = 2.0,
) -> Gateway:
    """The one place every long-lived object is created."""
    return Gateway(
        settings,
        registry=registry,
        environ=environ,
        policy_factory=policy_factory,
        health_interval_s=health_interval_s,
    )


__all__ = ["Gateway", "GatewayRuntime", "build_app"]
