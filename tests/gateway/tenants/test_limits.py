from __future__ import annotations

import pytest

from gateway.errors import RateLimitError
from gateway.tenants.limits import TenantLimiter, TenantLimits, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_refills_at_rate_and_reports_wait() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, capacity=4.0, clock=clock)
    assert all(bucket.try_take(1) == 0 for _ in range(4))
    assert bucket.try_take(1) == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.try_take(1) == 0


def test_requests_per_second_limit() -> None:
    clock = Clock()
    limiter = TenantLimiter(TenantLimits(requests_per_second=2, burst=2), clock)
    limiter.admit(10)
    limiter.admit(10)
    with pytest.raises(RateLimitError) as caught:
        limiter.admit(10)
    assert caught.value.retry_after_s == pytest.approx(0.5)
    assert caught.value.headers() == [(b"retry-after", b"1")]


def test_tokens_per_minute_charge_is_corrected_by_usage() -> None:
    clock = Clock()
    limiter = TenantLimiter(TenantLimits(tokens_per_minute=1000), clock)
    limiter.admit(600)
    limiter.release(600, used_tokens=100)  # it used far less than estimated: refund
    limiter.admit(800)
    with pytest.raises(RateLimitError, match="tokens per minute"):
        limiter.admit(800)


def test_concurrency_limit() -> None:
    limiter = TenantLimiter(TenantLimits(max_concurrency=1))
    limiter.admit(1)
    with pytest.raises(RateLimitError, match="concurrent"):
        limiter.admit(1)
    limiter.release(1, 1)
    limiter.admit(1)


def test_rejected_token_request_does_not_spend_the_request_budget() -> None:
    clock = Clock()
    limiter = TenantLimiter(
        TenantLimits(requests_per_second=1, burst=1, tokens_per_minute=60), clock
    )
    limiter.admit(60)
    clock.now += 1.0  # one request slot back, one token back
    with pytest.raises(RateLimitError, match="tokens"):
        limiter.admit(30)
    clock.now += 0.01
    limiter.admit(1)  # the request slot was returned when the token check refused


def test_a_request_larger_than_the_budget_passes_only_on_a_full_bucket() -> None:
    clock = Clock()
    limiter = TenantLimiter(TenantLimits(tokens_per_minute=100), clock)
    limiter.admit(500)  # otherwise it could never be served at all
    with pytest.raises(RateLimitError) as caught:
        limiter.admit(1)
    assert caught.value.retry_after_s > 60  # the overdraft is paid back first
