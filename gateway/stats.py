"""Plain records of what happened to a request; metrics and logs only consume them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gateway.protocol import EndpointKind


@dataclass(frozen=True, slots=True, eq=False)
class Ladder:
    """Tier names and relative costs of the configuration a request was served under, and
    its tenants' savings baselines (compared by identity: one Ladder per configuration)."""

    names: tuple[str, ...]
    costs: tuple[float, ...]
    # Per tenant, by tier name: (the best tier it may use, the uniform floor tier or None).
    # A request routed before a reload that changed them is credited against these, not
    # against the new ones. A tenant missing here takes the metrics' current baselines.
    baselines: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)


class Attempt(NamedTuple):
    """One try against one upstream endpoint."""

    tier: int
    endpoint: str
    outcome: str  # "ok", "connect_error", "timeout", "status_5xx", "saturated", ...


@dataclass(slots=True)
class RequestRecord:
    """Everything the sinks need about one finished request."""

    tenant: str
    kind: EndpointKind
    ladder: Ladder
    status: int = 0
    stream: bool = False
    decided_tier: int | None = None  # what routing chose
    served_tier: int | None = None  # what actually answered (after any escalation)
    probability: float | None = None
    reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_s: float = 0.0
    ttft_s: float | None = None
    overhead_s: float = 0.0
    attempts: list[Attempt] = field(default_factory=list)
    error_after_first_byte: bool = False
    streamed_events: int = 0  # SSE events relayed to the client
    client_disconnected: bool = False
    rejected: str | None = None  # why admission refused it (a fixed code vocabulary)
    request_id: bytes = b""  # the gateway's x-request-id (request_ids.py)
    request_bytes: int = 0  # of the client's body
    upload_s: float = 0.0  # reading the client's body: the client's time, not overhead


@dataclass(frozen=True, slots=True)
class EndpointSample:
    tier: str
    endpoint: str
    up: bool
    circuit_state: int  # 0 closed, 1 half-open, 2 open
    inflight: int


@dataclass(frozen=True, slots=True)
class TierSample:
    tier: str
    queued: int


@dataclass(frozen=True, slots=True)
class CompletedExchange:
    """A sampled request that was answered in full, handed to off-path listeners."""

    tenant: str
    kind: EndpointKind
    tier: str
    tier_index: int
    request: dict[str, Any]
    body: bytes  # the bytes relayed to the client (JSON, or the SSE events)
    probability: float | None
    probabilities: tuple[float, ...] | None
    reason: str
    score: float | None = None
    request_id: str = ""  # the gateway's x-request-id of the client's request
    # The tier names at capture, cheapest first (empty: not known). `tier_index` and the
    # probabilities are positions in it, which a reload may give to other tiers.
    ladder: tuple[str, ...] = ()
    request_bytes: int = 0  # of the client's body: with `body`, what holding it costs
    # The router model that scored it (its weights' checksum; None: not known). `score` is
    # that model's, meaningless to another one a reload may have swapped in.
    router_model: str | None = None
    # The prefix-cache namespace it was served under (vLLM's cache_salt; None: shared): the
    # replay and the shadow's replays use the same one.
    cache_salt: str | None = None

    @property
    def size(self) -> int:
        """Bytes of request and answer this exchange holds (for bounded queues)."""
        return self.request_bytes + len(self.body)


__all__ = [
    "Attempt",
    "CompletedExchange",
    "EndpointSample",
    "Ladder",
    "RequestRecord",
    "TierSample",
]
