"""Admission per tenant: body and max_tokens caps, then rate, token and concurrency limits.

Limits live in this replica's memory, or in Redis when `shared_limits.redis_url` is set (so
several replicas enforce one budget per tenant). Limiters outlive configuration reloads (a
reload must not hand every tenant a fresh burst): `configure` keeps a tenant's limiter, and
when its limits change it keeps the requests in flight and the bucket levels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.errors import InvalidRequestError
from gateway.protocol import EndpointKind, completion_budget
from gateway.tenants.limits import TenantLimiter, TenantLimits, estimate_tokens
from gateway.tenants.registry import Tenant
from gateway.tenants.shared_limits import (
    LEASE_S,
    RENEWALS_PER_LEASE,
    SharedHold,
    SharedLimiter,
    renew_leases,
)

# How long a shutdown waits for shared holds still being given back to Redis (its client's
# socket timeout is 0.5 s).
SETTLE_S: Final = 1.0


@dataclass(slots=True)
class Ticket:
    """An admitted request's hold on its tenant's limits; give it back with `release`."""

    admission: Admission
    tenant: str
    limiter: TenantLimiter | SharedLimiter | None
    estimate: int
    hold: SharedHold | None = None
    released: bool = False
    # False when the in-process limiter had no token budget at admission: a reload may add
    # one before the release, which must then not refund an estimate it never charged.
    charged: bool = True

    async def release(self, used_tokens: int | None, *, at_least: int = 0) -> None:
        """Gives the hold back; the first call counts, later ones do nothing. Without usage
        (None) the estimate stays charged, or `at_least` when that is more: what the request
        is known to have cost (a stream's relayed events)."""
        if self.released:
            return
        if used_tokens is None and at_least > self.estimate:
            used_tokens = at_least
        self.released = True
        self.admission.inflight[self.tenant] -= 1
        limiter = self.limiter
        if isinstance(limiter, SharedLimiter):
            release = limiter.release(self.hold, self.estimate, used_tokens)
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # cut (the shutdown's limit)
                await self.admission.give_back(release)
            else:  # a task of its own costs ~11 us a release: only where it is needed
                await release
        elif limiter is not None:
            limiter.release(self.estimate, used_tokens if self.charged else None)


class Admission:
    def __init__(
        self,
        redis: Any = None,
        *,
        prefix: str = "tiergate",
        max_request_s: float = 900.0,
        lease_s: float = LEASE_S,
    ) -> None:
        self.redis = redis  # a redis.asyncio.Redis, or None for in-process limits
        self.prefix = prefix
        self.max_request_s = max_request_s
        self.lease_s = lease_s  # of a shared concurrency slot (shared_limits.LEASE_S)
        self.inflight: dict[str, int] = {}
        self._limiters: dict[str, TenantLimiter | SharedLimiter | None] = {}
        # Shared limiters a reload replaced whose tickets still hold slots to renew.
        self._replaced: list[SharedLimiter] = []
        self._giving_back: set[asyncio.Task[None]] = set()

    async def give_back(self, release: Coroutine[Any, Any, None]) -> None:
        """Runs a shared hold's release in a task of its own, for a request whose task is
        being cancelled. A stream cut by the shutdown's time limit releases then, and the
        event loop's close cancels it again: the release to Redis was lost, and the tenant's
        concurrency slot stayed taken on every replica until its lease lapsed
        (shared_limits.LEASE_S)."""
        task = asyncio.get_running_loop().create_task(release)
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)
        await asyncio.shield(task)

    async def keep_leases(self) -> None:
        """Renews the leases of the shared concurrency slots this process holds, until
        cancelled (the gateway's shutdown; its releases remove the slots themselves)."""
        while True:
            await asyncio.sleep(self.lease_s / RENEWALS_PER_LEASE)
            self._replaced = [limiter for limiter in self._replaced if limiter.holds]
            current = [lim for lim in self._limiters.values() if isinstance(lim, SharedLimiter)]
            await renew_leases([*current, *self._replaced])

    async def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Waits, at most `timeout_s`, for the shared releases still under way (at shutdown)."""
        if self._giving_back:
            await asyncio.wait(set(self._giving_back), timeout=timeout_s)

    def configure(self, tenants: Mapping[str, Tenant]) -> None:
        # In process, a tenant keeps one limiter for good, also while it is unlimited or
        # absent: every ticket counts in it, so limits that come back on a later reload
        # see the requests still in flight (a fresh limiter would admit them all again).
        limiters: dict[str, TenantLimiter | SharedLimiter | None] = {
            name: limiter
            for name, limiter in self._limiters.items()
            if isinstance(limiter, TenantLimiter)
        }
        for name, tenant in tenants.items():
            settings = tenant.settings.limits
            limits = TenantLimits(
                requests_per_second=settings.requests_per_second,
                burst=settings.burst,
                tokens_per_minute=settings.tokens_per_minute,
                max_concurrency=settings.max_concurrency,
            )
            kept = self._limiters.get(name)
            if kept is not None and kept.limits == limits:
                if isinstance(kept, SharedLimiter):  # timeouts.total_s may have changed
                    kept.max_request_s = self.max_request_s
                    kept.lease_s = self.lease_s
                limiters[name] = kept
            elif self.redis is not None and limits == TenantLimits():
                limiters[name] = None  # unlimited: admission costs no round trip to Redis
            elif self.redis is not None:
                # The counts live in Redis under the tenant's name: new limits read them.
                limiters[name] = SharedLimiter(
                    self.redis,
                    name,
                    limits,
                    prefix=self.prefix,
                    max_request_s=self.max_request_s,
                    lease_s=self.lease_s,
                )
            elif isinstance(kept, TenantLimiter):
                # In place: tickets in flight release into this same limiter.
                kept.reconfigure(limits)
                limiters[name] = kept
            else:
                limiters[name] = TenantLimiter(limits)
            self.inflight.setdefault(name, 0)
        kept_ids = {id(limiter) for limiter in limiters.values()}
        self._replaced += [
            old
            for old in self._limiters.values()
            if isinstance(old, SharedLimiter) and id(old) not in kept_ids and old.holds
        ]
        self._limiters = limiters

    @staticmethod
    def body_limit(tenant: Tenant, gateway_limit: int) -> int:
        own = tenant.settings.limits.max_body_bytes
        return gateway_limit if own is None else min(own, gateway_limit)

    async def admit(
        self,
        tenant: Tenant,
        request: dict[str, Any],
        body_bytes: int,
        kind: EndpointKind,
    ) -> Ticket:
        """Applies the tenant's max_tokens cap (may set max_tokens), then its limits."""
        cap = tenant.settings.limits.max_tokens
        field, asked = completion_budget(kind, request)
        if cap is not None:
            if kind == "responses":
                _refuse_builtin_tools(request, cap)
            if asked is None or (asked > cap and request.get(field) is None):
                # Unset: up to the context length (chat, responses) or vLLM's default
                # (completions), whose field completion_budget names.
                request[field] = asked = cap
            elif asked > cap:
                raise InvalidRequestError(
                    f"{field} is {asked}; this key may ask for at most {cap}.",
                    param=field,
                    code="max_tokens_exceeded",
                )
        limiter = self._limiters.get(tenant.name)
        estimate = 0
        hold = None
        charged = True
        if limiter is not None:
            choices = _completions_asked(kind, request)
            estimate = estimate_tokens(body_bytes, None if asked is None else asked * choices)
            if isinstance(limiter, SharedLimiter):
                hold = await limiter.admit(estimate)
            else:
                charged = limiter.charges_tokens
                limiter.admit(estimate)
        self.inflight[tenant.name] = self.inflight.get(tenant.name, 0) + 1
        return Ticket(self, tenant.name, limiter, estimate, hold, charged=charged)


def _refuse_builtin_tools(request: Mapping[str, Any], cap: int) -> None:
    """Tools the engine runs itself (web search, code interpreter; vLLM's --tool-server) make
    it loop over turns, each with a fresh max_output_tokens: a capped key could get the cap
    once per turn."""
    tools = request.get("tools") or ()
    builtin = sorted({str(t.get("type")) for t in tools if isinstance(t, dict)} - {"function"})
    if builtin:
        raise InvalidRequestError(
            f"Built-in tools ({', '.join(builtin)}) run several turns in the engine, each up "
            f"to max_output_tokens; this key's output is capped at {cap} tokens, so only "
            "function tools are accepted.",
            param="tools",
            code="max_tokens_exceeded",
        )


def _completions_asked(kind: EndpointKind, request: Mapping[str, Any]) -> int:
    """How many completions the request asks for: n for each prompt, as a completions
    request may list several prompts (strings or token lists; one list of ints is one). A
    Responses request has no `n` (vLLM ignores one as an unknown field, and the gateway does
    not validate it there): one answer."""
    if kind == "responses":
        return 1
    choices: int = request.get("n") or 1
    prompts = request.get("prompt") if kind == "completions" else None
    if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int):
        choices *= len(prompts)
    return choices


__all__ = ["Admission", "Ticket"]
