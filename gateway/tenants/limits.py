"""Per-tenant admission limits: requests per second, tokens per minute, concurrency.

Token buckets with an injected clock; pure bookkeeping, no I/O. Tokens are charged at
admission from an estimate (prompt characters / 4 plus max_tokens) and corrected with the
usage the upstream reports, so a tenant's budget tracks what it really consumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from gateway.errors import RateLimitError

# When a request sets no max_tokens, its completion is charged at this estimate until the
# real usage arrives.
DEFAULT_COMPLETION_ESTIMATE: Final = 256


@dataclass(slots=True)
class TokenBucket:
    """`rate` units per second, holding at most `capacity`; may go negative after a debit."""

    rate: float
    capacity: float
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    level: float = -1.0
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.level < 0:
            self.level = self.capacity
        self.updated = self.clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def try_take(self, amount: float) -> float:
        """Takes `amount` and returns 0, or takes nothing and returns seconds to wait."""
        self._refill()
        if self.level >= amount or (amount > self.capacity and self.level >= self.capacity):
            self.level -= amount
            return 0.0
        return (min(amount, self.capacity) - self.level) / self.rate

    def adjust(self, delta: float) -> None:
        """Credits (positive) or debits (negative) after the fact."""
        self._refill()
        self.level = min(self.capacity, self.level + delta)


@dataclass(slots=True)
class TenantLimits:
    """The limits one tenant runs under; None means unlimited."""

    requests_per_second: float | None = None
    burst: float | None = None
    tokens_per_minute: float | None = None
    max_concurrency: int | None = None


class TenantLimiter:
    """Admission control for one tenant (in process; one per gateway replica)."""

    def __init__(self, limits: TenantLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.inflight = 0
        self._clock = clock
        self._requests: TokenBucket | None = None
        self._tokens: TokenBucket | None = None
        self.limits = TenantLimits()
        self.reconfigure(limits)

    def reconfigure(self, limits: TenantLimits) -> None:
        """New limits for the same tenant, keeping what it has used: requests in flight stay
        counted and each bucket keeps its level (capped at its new size), so tightening a
        tenant's limits on a reload never hands it a fresh burst."""
        rps = limits.requests_per_second
        burst = None if rps is None else limits.burst or max(1.0, rps)
        self._requests = self._resized(self._requests, rps, burst)
        tpm = limits.tokens_per_minute
        self._tokens = self._resized(self._tokens, None if tpm is None else tpm / 60.0, tpm)
        self.limits = limits

    def _resized(
        self, old: TokenBucket | None, rate: float | None, capacity: float | None
    ) -> TokenBucket | None:
        if rate is None or capacity is None:
            return None
        bucket = TokenBucket(rate, capacity, self._clock)
        if old is not None:
            old.adjust(0.0)  # brings its level up to now
            bucket.level = min(old.level, capacity)
        return bucket

    @property
    def charges_tokens(self) -> bool:
        """Whether `admit` charges the estimate now (the tenant has a token budget)."""
        return self._tokens is not None

    def admit(self, estimated_tokens: int) -> None:
        """Reserves a slot or raises RateLimitError (429, with the wait in Retry-After)."""
        limit = self.limits.max_concurrency
        if limit is not None and self.inflight >= limit:
            raise RateLimitError(
                f"Too many concurrent requests: the limit is {limit}.",
                retry_after_s=1.0,
                code="concurrency_limit_exceeded",
            )
        if self._requests is not None:
            wait = self._requests.try_take(1.0)
            if wait > 0:
                raise RateLimitError(
                    f"Rate limit of {self.limits.requests_per_second:g} requests per second "
                    "exceeded.",
                    retry_after_s=wait,
                )
        if self._tokens is not None:
            wait = self._tokens.try_take(float(estimated_tokens))
            if wait > 0:
                if self._requests is not None:
                    self._requests.adjust(1.0)  # the request was not admitted after all
                raise RateLimitError(
                    f"Token limit of {self.limits.tokens_per_minute:g} tokens per minute exceeded.",
                    retry_after_s=wait,
                    code="token_limit_exceeded",
                )
        self.inflight += 1

    def release(self, estimated_tokens: int, used_tokens: int | None) -> None:
        """Frees the slot and corrects the token charge with the real usage."""
        self.inflight = max(0, self.inflight - 1)
        if self._tokens is not None and used_tokens is not None:
            self._tokens.adjust(float(estimated_tokens - used_tokens))


def estimate_tokens(body_bytes: int, max_tokens: int | None) -> int:
    """Admission-time token estimate: ~4 bytes per prompt token plus the completion budget."""
    return body_bytes // 4 + (max_tokens if max_tokens is not None else DEFAULT_COMPLETION_ESTIMATE)


__all__ = ["TenantLimiter", "TenantLimits", "TokenBucket", "estimate_tokens"]
