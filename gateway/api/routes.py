"""The non-generation endpoints: models, liveness, readiness, metrics, the OpenAPI document.

These run on Starlette; they are not on the per-token hot path.
"""

from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.api.openapi import openapi_document
from gateway.errors import AuthenticationError, NotFoundError, TiergateError
from gateway.tenants.registry import one_authorization

if TYPE_CHECKING:
    from gateway.app import GatewayRuntime

_STARTED = int(time.time())


def runtime_of(request: Request) -> GatewayRuntime:
    runtime: GatewayRuntime = request.app.state.gateway.runtime
    return runtime


def error_response(exc: TiergateError) -> Response:
    return Response(
        exc.body(),
        status_code=exc.status,
        media_type="application/json",
        headers={k.decode(): v.decode() for k, v in exc.headers()},
    )


def bearer_matches(request: Request, token: str) -> bool:
    """Whether the request carries exactly one `Authorization: Bearer <token>` header
    (compared in constant time): with several, servers disagree on which one counts."""
    values = request.headers.getlist("authorization")
    scheme, _, presented = values[0].partition(" ") if len(values) == 1 else ("", "", "")
    # Starlette decodes header bytes as latin-1: encoding back to latin-1 gives the bytes
    # the client sent, so a token beyond ASCII matches its UTF-8 form, as tenant keys do.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode("latin-1"), token.encode()
    )


def _model_ids(request: Request) -> list[str]:
    """The public model and the pins the caller may use; raises 401 for a bad key."""
    runtime = runtime_of(request)
    values = [value.encode("latin-1") for value in request.headers.getlist("authorization")]
    tenant = runtime.tenants.authenticate(one_authorization(values))
    public = runtime.settings.model
    ids = [public]
    if tenant.allow_pinning:
        ids += [f"{public}@{runtime.settings.tiers[i].name}" for i in tenant.allowed_tiers]
    return ids


def _model(model_id: str) -> dict[str, object]:
    return {"id": model_id, "object": "model", "created": _STARTED, "owned_by": "tiergate"}


async def list_models(request: Request) -> Response:
    try:
        ids = _model_ids(request)
    except TiergateError as exc:
        return error_response(exc)
    return JSONResponse({"object": "list", "data": [_model(i) for i in ids]})


async def retrieve_model(request: Request) -> Response:
    """GET /v1/models/{model} (the SDK's `models.retrieve`): one of `list_models`, else 404."""
    try:
        ids = _model_ids(request)
    except TiergateError as exc:
        return error_response(exc)
    wanted = request.path_params["model"]
    if wanted not in ids:
        return error_response(
            NotFoundError(
                f"The model '{wanted}' does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        )
    return JSONResponse(_model(wanted))


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    runtime = runtime_of(request)
    # Usable: healthy and not ejected by its circuit breaker (requests would skip it).
    tiers = {tier.name: tier.usable for tier in runtime.tiers}
    ok = any(tiers.values()) and not request.app.state.gateway.draining
    return JSONResponse({"ready": ok, "tiers": tiers}, status_code=200 if ok else 503)


async def metrics(request: Request) -> Response:
    token = runtime_of(request).metrics_token
    if token and not bearer_matches(request, token):
        return error_response(AuthenticationError("A valid metrics token is required."))
    body, content_type = request.app.state.gateway.exposition()
    return Response(body, media_type=content_type)


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document(runtime_of(request).settings.model))


__all__ = [
    "bearer_matches",
    "error_response",
    "health",
    "list_models",
    "metrics",
    "openapi",
    "ready",
    "retrieve_model",
]
