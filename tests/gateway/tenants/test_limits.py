from __future__ import annotations

import pytest

from gateway.errors import RateLimitError
from gateway.protocol import EndpointKind
from gateway.tenants.limits import TenantLimiter, TenantLimits, TokenBucket
from gateway.tenants.registry import Tenant, TenantRegistry


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
    # whole seconds for Retry-After, the exact wait for the SDKs' retry-after-ms
    assert caught.value.headers() == [(b"retry-after", b"1"), (b"retry-after-ms", b"500")]


def test_a_rate_the_config_allows_however_small_gives_headers_not_a_500() -> None:
    """requests_per_second: 1e-307 passes validation (> 0); its wait in milliseconds
    overflowed to infinity and every refusal of the tenant was a 500 with a traceback."""
    limiter = TenantLimiter(TenantLimits(requests_per_second=1e-307, burst=1), Clock())
    limiter.admit(10)
    with pytest.raises(RateLimitError) as caught:
        limiter.admit(10)
    year = str(365 * 24 * 3600).encode()
    assert caught.value.headers() == [(b"retry-after", year), (b"retry-after-ms", year + b"000")]


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


def test_new_limits_keep_what_the_tenant_already_used() -> None:
    # A reload that tightens a tenant's limits must not hand it a fresh burst or free slots.
    clock = Clock()
    limiter = TenantLimiter(
        TenantLimits(requests_per_second=1, burst=10, tokens_per_minute=600, max_concurrency=5),
        clock,
    )
    for _ in range(5):
        limiter.admit(100)  # 5 in flight, 5 of the burst and 500 of 600 tokens spent
    limiter.reconfigure(
        TenantLimits(requests_per_second=1, burst=20, tokens_per_minute=1200, max_concurrency=3)
    )
    assert limiter.inflight == 5
    with pytest.raises(RateLimitError, match="concurrent requests: the limit is 3"):
        limiter.admit(1)
    for _ in range(3):
        limiter.release(100, 100)
    limiter.admit(50)  # a slot was free again; tokens left: 100 - 50
    limiter.release(100, 100)
    with pytest.raises(RateLimitError, match="tokens per minute"):
        limiter.admit(100)
    # A bucket keeps its level but never more than its new size.
    limiter.reconfigure(TenantLimits(requests_per_second=1, burst=2))
    limiter.admit(1)
    limiter.admit(1)
    with pytest.raises(RateLimitError, match="requests per second"):
        limiter.admit(1)


def test_a_reload_that_tightens_concurrency_counts_the_requests_in_flight() -> None:
    import asyncio

    from gateway.tenants.admission import Admission

    def tenants(limit: int) -> TenantRegistry:
        return registry_with({"max_concurrency": limit})

    async def scenario() -> None:
        admission = Admission()
        before = tenants(5)
        admission.configure(before.tenants)
        request = {"messages": [{"role": "user", "content": "hi"}]}
        tickets = [
            await admission.admit(before.tenants["t"], dict(request), 10, "chat") for _ in range(5)
        ]
        after = tenants(3)
        admission.configure(after.tenants)  # the reload
        with pytest.raises(RateLimitError, match="the limit is 3"):
            await admission.admit(after.tenants["t"], dict(request), 10, "chat")
        for ticket in tickets[:3]:
            await ticket.release(None)  # requests admitted before the reload still count down
        await admission.admit(after.tenants["t"], dict(request), 10, "chat")

    asyncio.run(scenario())


def test_limits_that_come_back_on_a_reload_count_the_requests_in_flight() -> None:
    """A reload lifts a tenant's limits (or drops the tenant), a later one restores them:
    the requests admitted meanwhile, and before, are still in flight and must count."""
    import asyncio

    from gateway.tenants.admission import Admission

    async def scenario() -> None:
        admission = Admission()
        request = {"messages": [{"role": "user", "content": "hi"}]}
        limited = registry_with({"max_concurrency": 2}).tenants
        admission.configure(limited)
        first = await admission.admit(limited["t"], dict(request), 10, "chat")
        unlimited = registry_with({}).tenants
        admission.configure(unlimited)
        await admission.admit(unlimited["t"], dict(request), 10, "chat")
        admission.configure({})  # the tenant is gone for a while
        admission.configure(limited)
        with pytest.raises(RateLimitError, match="the limit is 2"):
            await admission.admit(limited["t"], dict(request), 10, "chat")
        await first.release(None)
        await admission.admit(limited["t"], dict(request), 10, "chat")

    asyncio.run(scenario())


def test_a_token_budget_added_on_a_reload_refunds_no_estimate_it_never_charged() -> None:
    """A request admitted while the tenant had no token budget ends after a reload gave it
    one: its release refunded the estimate (minus usage) into the new budget, 4,900 tokens
    the tenant then spent again within the same minute."""
    import asyncio

    from gateway.tenants.admission import Admission

    async def scenario() -> None:
        admission = Admission()
        unlimited = registry_with({}).tenants
        admission.configure(unlimited)
        early = await admission.admit(unlimited["t"], {"max_tokens": 5000}, 0, "chat")
        limited = registry_with({"tokens_per_minute": 10_000}).tenants
        admission.configure(limited)
        await admission.admit(limited["t"], {"max_tokens": 10_000}, 0, "chat")
        await early.release(100)
        with pytest.raises(RateLimitError, match="tokens per minute"):
            await admission.admit(limited["t"], {"max_tokens": 4900}, 0, "chat")

    asyncio.run(scenario())


def test_a_kept_shared_limiter_takes_the_new_longest_request() -> None:
    """How long a live hold's Redis slot is renewed at most (a hold a bug never released)
    follows `timeouts.total_s` on a reload that leaves the tenant's limits as they were."""
    from gateway.tenants.admission import Admission
    from gateway.tenants.shared_limits import SharedLimiter

    class ScriptsOnly:
        def register_script(self, script: str) -> object:
            return object()

    admission = Admission(ScriptsOnly(), max_request_s=900.0)
    tenants = registry_with({"max_concurrency": 2}).tenants
    admission.configure(tenants)
    before = admission._limiters["t"]
    admission.max_request_s = 60.0  # as the app's reload sets it
    admission.configure(tenants)
    kept = admission._limiters["t"]
    assert kept is before and isinstance(kept, SharedLimiter)
    assert kept.max_request_s == 60.0


def registry_with(limits: dict[str, object]) -> TenantRegistry:
    """Two tiers and one tenant `t` (key `k`) with these limits."""
    from gateway.config import parse_settings

    settings = parse_settings(
        {
            "model": "m",
            "tiers": [
                {"name": p, "precision": p, "endpoints": [f"http://h:{port}/v1"]}
                for port, p in ((1, "nvfp4"), (2, "bf16"))
            ],
            "tenants": [{"name": "t", "api_keys": ["k"], "limits": limits}],
        }
    )
    return TenantRegistry(settings, {})


def capped_tenant(cap: int) -> Tenant:
    return registry_with({"max_tokens": cap, "tokens_per_minute": 100_000}).tenants["t"]


@pytest.mark.parametrize(
    ("kind", "request_fields", "outcome"),
    [
        # Completions: vLLM reads max_tokens only, so the cap does too (it read 10 here).
        ("completions", {"max_completion_tokens": 10, "max_tokens": 2000}, "max_tokens"),
        # ... and ignores max_completion_tokens, whatever its type (it raised a TypeError: 500).
        ("completions", {"max_completion_tokens": "x"}, {"max_tokens": None}),
        # Unset, vLLM generates 16 tokens: the cap is set only where it is lower.
        ("completions", {}, {"max_tokens": None}),
        ("completions", {"max_tokens": None}, {"max_tokens": None}),  # null is unset
        ("chat", {"max_completion_tokens": 10, "max_tokens": 2000}, {"max_tokens": 2000}),
        ("chat", {"max_completion_tokens": 60}, "max_completion_tokens"),
        ("chat", {}, {"max_tokens": 50}),
    ],
)
def test_the_max_tokens_cap_reads_what_vllm_reads(
    kind: EndpointKind, request_fields: dict[str, object], outcome: object
) -> None:
    import asyncio

    from gateway.errors import InvalidRequestError
    from gateway.tenants.admission import Admission

    tenant = capped_tenant(50)
    admission = Admission()
    admission.configure({"t": tenant})
    request = dict(request_fields)
    if isinstance(outcome, str):
        with pytest.raises(InvalidRequestError) as caught:
            asyncio.run(admission.admit(tenant, request, 100, kind))
        assert caught.value.param == outcome
        return
    asyncio.run(admission.admit(tenant, request, 100, kind))
    assert isinstance(outcome, dict)
    assert request.get("max_tokens") == outcome["max_tokens"]


def test_a_low_cap_bounds_an_unset_completions_max_tokens() -> None:
    import asyncio

    from gateway.tenants.admission import Admission

    tenant = capped_tenant(8)
    admission = Admission()
    admission.configure({"t": tenant})
    request: dict[str, object] = {"prompt": "hi"}
    asyncio.run(admission.admit(tenant, request, 100, "completions"))
    assert request["max_tokens"] == 8


def test_an_idle_bucket_refills_to_its_capacity_and_no_further() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, capacity=4.0, clock=clock)
    bucket.try_take(4)
    clock.now += 3600.0  # an idle hour is worth 7,200 units at this rate, the bucket holds 4
    assert all(bucket.try_take(1) == 0 for _ in range(4))
    assert bucket.try_take(1) == pytest.approx(0.5)


def test_a_refund_never_fills_the_bucket_past_its_capacity() -> None:
    clock = Clock()
    limiter = TenantLimiter(TenantLimits(tokens_per_minute=1000), clock)
    limiter.admit(900)
    clock.now += 60.0  # a long request: the bucket refilled while it ran
    limiter.release(900, used_tokens=0)  # all refunded: still 1000, not 1900
    limiter.admit(1000)
    with pytest.raises(RateLimitError) as caught:
        limiter.admit(60)
    assert caught.value.retry_after_s == pytest.approx(3.6)  # 60 tokens at 1000 per minute


def test_an_oversized_request_waits_for_a_full_bucket_not_for_its_own_size() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=1.0, capacity=10.0, clock=clock)
    bucket.try_take(4)  # 6 left
    assert bucket.try_take(50) == pytest.approx(4.0)  # it passes once the bucket is full
    clock.now += 4.0
    assert bucket.try_take(50) == 0.0


def test_the_admission_estimate_is_a_quarter_of_the_body_plus_every_choice() -> None:
    import asyncio

    from gateway.tenants.admission import Admission
    from gateway.tenants.limits import DEFAULT_COMPLETION_ESTIMATE, estimate_tokens

    assert estimate_tokens(400, 10) == 110
    assert estimate_tokens(400, None) == 100 + DEFAULT_COMPLETION_ESTIMATE
    tenant = registry_with({"tokens_per_minute": 1000}).tenants["t"]
    admission = Admission()
    admission.configure({"t": tenant})
    request: dict[str, object] = {"max_tokens": 100, "n": 4}
    ticket = asyncio.run(admission.admit(tenant, request, 400, "chat"))
    assert ticket.estimate == 100 + 4 * 100  # n completions of up to max_tokens each


def test_a_json_request_left_while_the_engine_generated_keeps_its_estimate_charged() -> None:
    """Its client left before the answer (499): the engine had generated for it, so it is
    not refunded in full; a request nothing was sent for, or that the engine refused, is."""
    from gateway.api.openai import used_tokens
    from gateway.stats import Attempt, Ladder, RequestRecord

    def record(*outcomes: str) -> RequestRecord:
        done = RequestRecord(tenant="t", kind="chat", ladder=Ladder(("a",), (1.0,)))
        done.attempts = [Attempt(0, "http://h:1/v1", outcome) for outcome in outcomes]
        return done

    left = record("connect_error", "client_gone")
    left.status, left.client_disconnected = 499, True
    assert used_tokens(left) is None  # the admission estimate stays charged
    queued = record()
    queued.status, queued.client_disconnected = 499, True
    assert used_tokens(queued) == 0
    assert used_tokens(record("connect_error", "status_5xx")) == 0
    # A JSON answer cut by the request's total_s was being generated all along; a stream
    # cut before its first byte had generated nothing the client saw.
    assert used_tokens(record("deadline")) is None
    cut_stream = record("deadline")
    cut_stream.stream = True
    assert used_tokens(cut_stream) == 0


@pytest.mark.parametrize(
    ("prompt", "completions"),
    [("one", 2), ([1, 2, 3], 2), (["a", "b", "c"], 6), ([[1, 2], [3]], 4), ([], 2)],
)
def test_the_estimate_counts_every_prompt_of_a_completions_request(
    prompt: object, completions: int
) -> None:
    """vLLM answers each prompt of a list with n choices: 100 prompts of up to 100 tokens
    were estimated at 100 tokens, and let through far past the budget before any usage."""
    import asyncio

    from gateway.tenants.admission import Admission

    tenant = registry_with({"tokens_per_minute": 100_000}).tenants["t"]
    admission = Admission()
    admission.configure({"t": tenant})
    request = {"prompt": prompt, "max_tokens": 100, "n": 2}
    ticket = asyncio.run(admission.admit(tenant, request, 0, "completions"))
    assert ticket.estimate == completions * 100


@pytest.mark.parametrize("n", ["x", [1], 4])
def test_a_responses_request_is_estimated_as_one_answer_whatever_its_n(n: object) -> None:
    """The Responses API has no `n`: vLLM ignores one, and the gateway passes it unchecked.
    `"n": "x"` was multiplied into the estimate (a str times the budget): a 500."""
    import asyncio

    from gateway.tenants.admission import Admission

    tenant = registry_with({"tokens_per_minute": 100_000}).tenants["t"]
    admission = Admission()
    admission.configure({"t": tenant})
    request = {"input": "hi", "max_output_tokens": 100, "n": n}
    ticket = asyncio.run(admission.admit(tenant, request, 0, "responses"))
    assert ticket.estimate == 100


def test_an_extra_release_does_not_raise_the_concurrency_limit() -> None:
    limiter = TenantLimiter(TenantLimits(max_concurrency=1))
    limiter.release(1, None)  # a release without its admit (a double release)
    limiter.admit(1)
    with pytest.raises(RateLimitError, match="concurrent"):
        limiter.admit(1)
