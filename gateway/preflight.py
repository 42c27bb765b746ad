"""`tiergate check --probe`: asks every tier endpoint what the gateway will depend on.

For each endpoint, with the pool the gateway itself would use (the tier's key, TLS and
timeouts): is `/health` 200, does `/v1/models` take the tier's key, and does the engine serve
the model name the tier sends. `verdict` is the pure part: the answers in, the problems out.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.backends.h1client import UpstreamFailure
from gateway.backends.health import health_path
from gateway.backends.tier import EndpointState, TierBackend


@dataclass(frozen=True, slots=True)
class Answer:
    """What one GET returned: a status and body, or why there was none."""

    status: int | None = None
    body: bytes = b""
    error: str | None = None


@dataclass(slots=True)
class EndpointReport:
    tier: str
    endpoint: str
    model: str
    served: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "endpoint": self.endpoint,
            "model": self.model,
            "served": self.served,
            "ok": self.ok,
            "problems": self.problems,
        }


def verdict(tier: str, endpoint: str, model: str, health: Answer, models: Answer) -> EndpointReport:
    """The problems an endpoint's answers show, each in words an operator can act on."""
    report = EndpointReport(tier, endpoint, model)
    if health.error is not None:
        report.problems.append(f"/health: {health.error}")
    elif health.status != 200:
        report.problems.append(f"/health answered HTTP {health.status}")
    if models.error is not None:
        if health.error is None:  # the same unreachable endpoint is reported once
            report.problems.append(f"/v1/models: {models.error}")
        return report
    if models.status in {401, 403}:
        report.problems.append(
            f"/v1/models answered HTTP {models.status}: the engine wants a key; set the "
            "tier's api_key or api_key_env to its --api-key"
        )
        return report
    if models.status != 200:
        report.problems.append(f"/v1/models answered HTTP {models.status}")
        return report
    report.served = _model_ids(models.body)
    if model not in report.served:
        served = ", ".join(report.served) or "nothing"
        report.problems.append(
            f"the engine serves {served}, not {model!r}: set the tier's served_model_name"
        )
    return report


def _model_ids(body: bytes) -> list[str]:
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
        data = orjson.loads(body).get("data")
        return [str(card["id"]) for card in data if isinstance(card, dict) and "id" in card]
    return []


async def probe_tiers(tiers: list[TierBackend], timeout_s: float) -> list[EndpointReport]:
    """Probes every endpoint of every tier at once."""
    jobs = [
        _probe(tier.name, tier.served_model_name, state, timeout_s)
        for tier in tiers
        for state in tier.endpoints
    ]
    return list(await asyncio.gather(*jobs))


async def _probe(tier: str, model: str, state: EndpointState, timeout_s: float) -> EndpointReport:
    health = await _get(state, health_path(state), timeout_s)
    models = await _get(state, f"{state.endpoint.base_path}/models".encode(), timeout_s)
    return verdict(tier, state.url, model, health, models)


async def _get(state: EndpointState, path: bytes, timeout_s: float) -> Answer:
    try:
        response = await state.pool.request(
            state.pool.render(b"GET", path, b""),
            first_byte_timeout_s=timeout_s,
            total_timeout_s=timeout_s,
        )
    except UpstreamFailure as exc:
        return Answer(error=str(exc))
    try:
        return Answer(response.status, await response.read(1024 * 1024))
    except UpstreamFailure as exc:
        return Answer(error=str(exc))
    finally:
        response.release()


__all__ = ["Answer", "EndpointReport", "probe_tiers", "verdict"]
