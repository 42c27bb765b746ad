"""Plain records of what happened to a request; metrics and logs only consume them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Attempt:
    """One try against one upstream endpoint."""

    tier: int
    endpoint: str
    outcome: str  # "ok", "connect_error", "timeout", "status_5xx", "saturated", ...


@dataclass(slots=True)
class RequestRecord:
    """Everything the sinks need about one finished request."""

    tenant: str
    kind: str  # "chat" | "completions"
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
    client_disconnected: bool = False


__all__ = ["Attempt", "RequestRecord"]
