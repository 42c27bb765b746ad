"""Who else hears about an exchange: the regime observer and shadow evaluation.

Listeners are called on the request path, so every method must be cheap and must never
raise or block: real work goes onto their own bounded queues.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.protocol import EndpointKind
from gateway.stats import CompletedExchange


class ExchangeListener(Protocol):
    def wants_capture(
        self, tenant: str, tier: int, request: dict[str, Any], kind: EndpointKind
    ) -> bool:
        """Whether this request's answer should be kept for the listener (sampling), given
        the ladder tier routing chose for it, the request and the endpoint it came to (the
        regime observer samples by a hash of its conversation, read as the engine reads
        the body)."""
        ...

    def upstream_started(self, tier: str, tenant: str) -> None: ...

    def upstream_finished(self, tier: str, tenant: str) -> None: ...

    def exchange_done(self, exchange: CompletedExchange) -> None:
        """A request this listener asked to capture was answered 200 in full."""
        ...


__all__ = ["ExchangeListener"]
