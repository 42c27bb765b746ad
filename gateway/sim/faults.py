"""Faults a simulated tier can be told to show, from the command line or at run time."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Faults(BaseModel):
    """Mutable at run time through POST /sim/faults (the fault-injection tests use it)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)  # share answered HTTP 500 at once
    added_latency_s: float = Field(default=0.0, ge=0.0)  # delay before the response starts
    drop_mid_stream: float = Field(default=0.0, ge=0.0, le=1.0)  # share of streams cut short
    drop_after_chunks: int = Field(default=2, ge=0)
    # Connections are reset as soon as they are accepted (the client sees a connect error).
    refuse_connections: bool = False
    max_waiting: int | None = Field(default=None, ge=0)  # 503 when this many already wait


__all__ = ["Faults"]
