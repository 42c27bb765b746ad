"""Tenant limits shared by every gateway replica, kept in Redis.

The same semantics as the in-process limiter (tenants/limits.py), made atomic across
replicas with Lua scripts that read Redis' own clock:
- requests per second and tokens per minute are token buckets (a hash per tenant and
  limit: level, updated);
- concurrency is a sorted set of in-flight request ids scored by when their lease was last
  renewed. Each process renews the leases of the slots it holds every `LEASE_S / 4` (one
  script call per tenant, off the request path: `renew`), and an admission prunes the slots
  not renewed for `LEASE_S` (20 s): the slots of a replica or worker that dies (kill -9, an
  OOM kill, a lost node) come back to the tenant within 20 s.
When Redis cannot be reached, admission falls back to the replica's in-process limiter
(the limits then hold per replica) and logs it, rather than failing requests; it keeps to
the fallback for `REDIS_RETRY_S` before it asks Redis again, since a stalled Redis costs
every admission that asks it the client's socket timeout. An admission
that timed out may still run once a stalled Redis resumes: its concurrency slot is removed
in the background, or it would hold one of the tenant's slots for a lease; so is the slot
of a release that failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from gateway.errors import RateLimitError
from gateway.tenants.limits import TenantLimiter, TenantLimits

log = logging.getLogger("tiergate.limits")

# After a failed admission, how long the in-process fallback admits before Redis is asked
# again.
REDIS_RETRY_S: Final = 2.0

# Slots of failed admissions remembered for removal; past this many (a long outage) the
# rest are left to expire with their lease.
MAX_UNSURE_SLOTS: Final = 10_000

# How long a concurrency slot whose holder stopped renewing it counts against its tenant.
# Renewed every quarter of it, a live holder may miss three rounds in a row (each costs at
# most the client's 0.5 s socket timeout) before its slot goes: a Redis or event-loop stall
# of up to 15 s keeps the live requests counted, and a dead process frees its slots within
# 20 s instead of `timeouts.total_s` (900 s by default).
LEASE_S: Final = 20.0
RENEWALS_PER_LEASE: Final = 4

# Leads the scripts below: Redis' clock, and `store` for a bucket's level.
_PRELUDE: Final = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1e6
-- A missing bucket reads as full, so it may expire only once it has refilled: a deep debt
-- (a request that used far more than a minute's budget) is paid back as in process.
local function store(key, value, rate, cap)
  redis.call('HSET', key, 'level', value, 'updated', now)
  redis.call('EXPIRE', key, math.min(math.ceil((cap - value) / rate) + 60, 315360000))
end
"""

_ADMIT: Final = """
local max_conc, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local rps_rate, rps_cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local tpm_rate, tpm_cap, tokens = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local request_id = ARGV[8]

local function level(key, rate, cap)
  local state = redis.call('HMGET', key, 'level', 'updated')
  local current = tonumber(state[1]) or cap
  local updated = tonumber(state[2]) or now
  -- TIME is Redis' wall clock: after it steps back (NTP, a failover to a replica whose
  -- clock is behind), `updated` is in the future; the bucket then refills nothing rather
  -- than draining by the step and refusing the tenant until the clock catches up.
  return math.min(cap, current + math.max(0, now - updated) * rate)
end

if max_conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - lease)
  if redis.call('ZCARD', KEYS[3]) >= max_conc then
    return {1, '1'}
  end
end
local rps_level, tpm_level
if rps_rate > 0 then
  rps_level = level(KEYS[1], rps_rate, rps_cap)
  -- As for tokens: a burst below one request admits one whenever the bucket is full.
  local fits = rps_level >= 1 or (1 > rps_cap and rps_level >= rps_cap)
  if not fits then
    return {2, tostring((math.min(1, rps_cap) - rps_level) / rps_rate)}
  end
end
if tpm_rate > 0 then
  tpm_level = level(KEYS[2], tpm_rate, tpm_cap)
  local fits = tpm_level >= tokens or (tokens > tpm_cap and tpm_level >= tpm_cap)
  if not fits then
    return {3, tostring((math.min(tokens, tpm_cap) - tpm_level) / tpm_rate)}
  end
end
if rps_rate > 0 then
  store(KEYS[1], rps_level - 1, rps_rate, rps_cap)
end
if tpm_rate > 0 then
  store(KEYS[2], tpm_level - tokens, tpm_rate, tpm_cap)
end
if max_conc > 0 then
  redis.call('ZADD', KEYS[3], now, request_id)
  redis.call('EXPIRE', KEYS[3], math.ceil(lease) + 60)
end
return {0, '0'}
"""

_RELEASE: Final = """
redis.call('ZREM', KEYS[2], ARGV[1])
local tpm_rate, tpm_cap, delta = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if tpm_rate > 0 and delta ~= 0 then
  local state = redis.call('HMGET', KEYS[1], 'level', 'updated')
  local current = tonumber(state[1]) or tpm_cap
  local updated = tonumber(state[2]) or now
  local refilled = math.min(tpm_cap, current + math.max(0, now - updated) * tpm_rate)
  store(KEYS[1], math.min(tpm_cap, refilled + delta), tpm_rate, tpm_cap)
end
return 0
"""

# XX updates only the slots still in the set: a round that began before a release (or after
# an admission pruned the slot) must not bring it back.
_RENEW: Final = """
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now, ARGV[i])
end
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])) + 60)
return 0
"""

_REASONS: Final = {
    1: (
        "Too many concurrent requests: the limit is {max_concurrency}.",
        "concurrency_limit_exceeded",
    ),
    2: (
        "Rate limit of {requests_per_second:g} requests per second exceeded.",
        "rate_limit_exceeded",
    ),
    3: ("Token limit of {tokens_per_minute:g} tokens per minute exceeded.", "token_limit_exceeded"),
}


@dataclass(slots=True)
class SharedHold:
    """What `release` needs to give a shared admission back."""

    request_id: str
    estimate: int


class SharedLimiter:
    """One tenant's limits in Redis; `local` takes over while Redis is unreachable."""

    def __init__(
        self,
        client: Any,  # redis.asyncio.Redis
        tenant: str,
        limits: TenantLimits,
        *,
        prefix: str = "tiergate",
        max_request_s: float = 900.0,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self._clock = clock
        self._fallback_until = float("-inf")  # Redis failed: admit locally until then
        self.limits = limits
        self.local = TenantLimiter(limits)
        self.max_request_s = max_request_s
        self.lease_s = lease_s
        self._keys = [f"{prefix}:{tenant}:{kind}" for kind in ("rps", "tpm", "inflight")]
        self._admit = client.register_script(_PRELUDE + _ADMIT)
        self._release = client.register_script(_PRELUDE + _RELEASE)
        self._renew = client.register_script(_PRELUDE + _RENEW)
        # The slots this process holds in Redis, with when their request's time runs out
        # (on `clock`; the longest request at admission, which a reload may change after):
        # what `renew` keeps alive.
        self._held: dict[str, float] = {}
        # Request ids whose admission failed but may still run in Redis (with when it
        # failed, on the loop's clock), and the task that removes their slots.
        self._unsure: dict[str, float] = {}
        self._forgetting: asyncio.Task[None] | None = None

    @property
    def inflight(self) -> int:
        return self.local.inflight

    @property
    def holds(self) -> bool:
        """Whether this process holds slots in Redis whose leases need renewing."""
        return bool(self._held)

    def _args(self, estimate: int, request_id: str) -> list[Any]:
        limits = self.limits
        rps = limits.requests_per_second or 0.0
        tpm = limits.tokens_per_minute or 0.0
        return [
            limits.max_concurrency or 0,
            self.lease_s,
            rps,
            limits.burst or max(1.0, rps),
            tpm / 60.0,
            tpm,
            estimate,
            request_id,
        ]

    async def admit(self, estimate: int) -> SharedHold | None:
        """A hold on the shared limits, or None when the local fallback admitted instead."""
        if self._clock() < self._fallback_until:
            self.local.admit(estimate)
            return None
        request_id = uuid.uuid4().hex
        try:
            code, wait = await self._admit(keys=self._keys, args=self._args(estimate, request_id))
        except Exception as exc:  # connection refused, timeout, Redis restarting...
            log.warning(
                "shared limits unavailable (%s); using this replica's limits for %g s",
                exc,
                REDIS_RETRY_S,
            )
            self._fallback_until = self._clock() + REDIS_RETRY_S
            if self.limits.max_concurrency:
                self._forget_later(request_id)
            self.local.admit(estimate)
            return None
        code = int(code)
        if code:
            message, reason = _REASONS[code]
            raise RateLimitError(
                message.format(**_fields(self.limits)),
                retry_after_s=max(float(wait), 0.001),
                code=reason,
            )
        self.local.inflight += 1
        if self.limits.max_concurrency:
            self._held[request_id] = self._clock() + self.max_request_s
        return SharedHold(request_id, estimate)

    async def release(
        self, hold: SharedHold | None, estimate: int, used_tokens: int | None
    ) -> None:
        if hold is None:
            self.local.release(estimate, used_tokens)
            return
        self.local.inflight = max(0, self.local.inflight - 1)
        self._held.pop(hold.request_id, None)  # before the release: no round renews it after
        tpm = self.limits.tokens_per_minute or 0.0
        delta = 0 if used_tokens is None else estimate - used_tokens
        try:
            await self._release(
                keys=[self._keys[1], self._keys[2]], args=[hold.request_id, tpm / 60.0, tpm, delta]
            )
        except Exception as exc:
            log.warning("shared limits: release failed (%s); its slot goes once Redis answers", exc)
            if self.limits.max_concurrency:
                # Left in Redis, the slot would count against the tenant for a lease
                # (LEASE_S) after Redis is reachable again.
                self._forget_later(hold.request_id)

    async def renew(self) -> None:
        """Renews the leases of the slots this process holds, in one script call. A hold
        older than the longest request (timeouts.total_s when it was admitted) is no longer
        renewed: one that a bug never released frees its slot a lease later, as a dead
        process's does."""
        now = self._clock()
        self._held = {key: ends for key, ends in self._held.items() if ends > now}
        if self._held:
            await self._renew(keys=[self._keys[2]], args=[self.lease_s, *self._held])

    def _forget_later(self, request_id: str) -> None:
        loop = asyncio.get_running_loop()
        if len(self._unsure) < MAX_UNSURE_SLOTS:
            self._unsure[request_id] = loop.time()
        if self._forgetting is None or self._forgetting.done():
            self._forgetting = loop.create_task(self._forget())

    async def _forget(self, retry_s: float = 1.0) -> None:
        """Removes the slots of admissions that may run late, once Redis answers again.

        A stalled Redis runs what it had already received before it answers a command sent
        after it resumed; so the removal is sent once more after one has been answered, and
        then no late admission can follow it. Slots never renewed are pruned a lease after
        they were taken by the admission script itself."""
        loop = asyncio.get_running_loop()
        while self._unsure:
            oldest = loop.time() - self.max_request_s
            self._unsure = {key: at for key, at in self._unsure.items() if at > oldest}
            ids = list(self._unsure)
            if not ids:
                break
            try:
                for _ in range(2):
                    await self.client.zrem(self._keys[2], *ids)
            except Exception:
                await asyncio.sleep(retry_s)
                continue
            for request_id in ids:
                self._unsure.pop(request_id, None)


def _fields(limits: TenantLimits) -> dict[str, Any]:
    return {
        "requests_per_second": limits.requests_per_second or 0.0,
        "tokens_per_minute": limits.tokens_per_minute or 0.0,
        "max_concurrency": limits.max_concurrency or 0,
    }


async def renew_leases(limiters: Iterable[SharedLimiter]) -> None:
    """One renewal round: every limiter holding slots renews them, all at once, so a stalled
    Redis costs the round one socket timeout, not one per tenant."""
    holding = [limiter for limiter in limiters if limiter.holds]
    results = await asyncio.gather(
        *(limiter.renew() for limiter in holding), return_exceptions=True
    )
    failed = [result for result in results if isinstance(result, Exception)]
    if failed:
        log.warning(
            "shared limits: renewing the concurrency slots of %d tenants failed (%s); slots "
            "no renewal reaches for %g s are freed for other replicas",
            len(failed),
            failed[0],
            holding[0].lease_s,
        )


__all__ = ["LEASE_S", "SharedHold", "SharedLimiter", "renew_leases"]
