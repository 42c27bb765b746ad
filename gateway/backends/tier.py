"""Upstream endpoints grouped by ladder tier, with the bookkeeping the proxy needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.backends.h1client import ConnectionPool
from gateway.config import Endpoint, Settings, TierSettings


@dataclass(slots=True, eq=False)
class EndpointState:
    """One upstream base URL of a tier: its connection pool and live counters."""

    tier: str
    endpoint: Endpoint
    pool: ConnectionPool
    max_inflight: int
    inflight: int = 0
    healthy: bool = True
    chat_path: bytes = b""
    completions_path: bytes = b""

    def __post_init__(self) -> None:
        self.chat_path = f"{self.endpoint.base_path}/chat/completions".encode()
        self.completions_path = f"{self.endpoint.base_path}/completions".encode()

    @property
    def url(self) -> str:
        return self.endpoint.url

    @property
    def saturated(self) -> bool:
        return self.inflight >= self.max_inflight

    @property
    def available(self) -> bool:
        return self.healthy and not self.saturated


@dataclass(slots=True, eq=False)
class TierBackend:
    """A ladder tier: its settings and endpoints."""

    index: int
    settings: TierSettings
    served_model_name: str
    endpoints: list[EndpointState] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.settings.name

    def pick(
        self, exclude: set[EndpointState] | frozenset[EndpointState] = frozenset()
    ) -> EndpointState | None:
        """The least-loaded available endpoint not in `exclude` (ties: config order)."""
        best: EndpointState | None = None
        for state in self.endpoints:
            if state in exclude or not state.available:
                continue
            if best is None or state.inflight < best.inflight:
                best = state
        return best

    @property
    def healthy(self) -> bool:
        return any(state.healthy for state in self.endpoints)

    def close(self) -> None:
        for state in self.endpoints:
            state.pool.close()


def build_tiers(settings: Settings) -> list[TierBackend]:
    tiers = []
    for index, tier in enumerate(settings.tiers):
        backend = TierBackend(
            index=index,
            settings=tier,
            served_model_name=tier.served_model_name or settings.model,
        )
        for endpoint in tier.parsed_endpoints:
            backend.endpoints.append(
                EndpointState(
                    tier=tier.name,
                    endpoint=endpoint,
                    pool=ConnectionPool(
                        endpoint.host,
                        endpoint.port,
                        connect_timeout_s=settings.timeouts.connect_s,
                    ),
                    max_inflight=tier.max_inflight_per_endpoint,
                )
            )
        tiers.append(backend)
    return tiers


__all__ = ["EndpointState", "TierBackend", "build_tiers"]
