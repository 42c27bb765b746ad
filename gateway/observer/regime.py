"""Rolling-window regime tracker: C, rho and r per (tier, tenant), pure and bounded.

The gateway's observer feeds events with timestamps it reads itself; nothing here reads a
clock, does I/O or awaits. Events land in fixed-width time buckets (`bucket_s`); a report sums
the buckets inside the window, so memory per key is at most window / bucket_s buckets.

- Concurrency is time-weighted: each bucket holds seconds spent at each in-flight level, so
  mean, p50 and p95 are over time, not over events, and cover the whole tier. Engine scrapes
  add running + waiting per replica. The cost model's C is per engine
  (`per_engine_concurrency`).
- rho comes from replaying sampled prompts through one prefix-cache replay per tier (the
  engine's cache is shared by its tenants): unbounded (capped at `max_replay_blocks` for
  memory) and LRU-bounded by the tier's `num_gpu_blocks`. Hits are credited to the tenant whose
  request hit. Sampling whole sessions keeps the estimate faithful; sampling requests
  independently undercounts sharing, because an unsampled request's blocks are never cached.
  The live observer samples by a hash of the conversation (`sampling_key`) and passes the
  rate with each prompt: the LRU bound is the engine's capacity scaled by that rate (SHARDS).
  Engine rho is the prefix-cache hits/queries delta between scrapes of each replica, summed
  over the replicas (APC on only).
- r is the n-gram replay of sampled (prompt, completion) pairs (r_iid, c.4), and, where the
  tier speculates, A^-1(A_obs) / eta from the spec-decode counters (c.3).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from gateway.observer.acceptance import inverse_accepted_per_round
from gateway.observer.ngram_replay import NgramCounts, replay_pair
from gateway.observer.prefix_replay import PrefixCacheReplay, salt_key
from gateway.observer.sampling_key import scaled_capacity
from gateway.observer.vllm_metrics import CounterDeltas, VllmMetricsSnapshot, counter_deltas

__all__ = [
    "ALL_TENANTS",
    "OTHER_TENANTS",
    "ConcurrencySummary",
    "RSummary",
    "RegimeReport",
    "RegimeTracker",
    "RhoSummary",
    "TrackerConfig",
    "per_engine_concurrency",
]

ALL_TENANTS: Final = "*"
OTHER_TENANTS: Final = "~other"


@dataclass(frozen=True)
class TrackerConfig:
    """Window W and bucket width in seconds; replay settings mirror the served engine."""

    window_s: float = 300.0
    bucket_s: float = 5.0
    block_size: int = 16
    min_n: int = 2
    max_n: int = 4
    num_speculative_tokens: int = 4
    max_replay_blocks: int = 1 << 20
    max_tenants_per_tier: int = 256

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.bucket_s <= 0 or self.bucket_s > self.window_s:
            raise ValueError("need 0 < bucket_s <= window_s")


@dataclass
class _Bucket:
    index: int
    level_seconds: dict[int, float] = field(default_factory=dict)
    prompt_tokens: int = 0
    prompts: int = 0
    hits_unbounded: int = 0
    hits_lru: int = 0
    ngram: NgramCounts = field(default_factory=NgramCounts)
    completion_tokens: int = 0
    completions: int = 0
    engine: CounterDeltas = field(default_factory=CounterDeltas)
    engine_c_sum: float = 0.0
    engine_c_samples: int = 0


class _Series:
    """Buckets of one (tier, tenant) plus its live in-flight level."""

    def __init__(self, n_buckets: int, bucket_s: float) -> None:
        self._n = n_buckets
        self._width = bucket_s
        self._buckets: deque[_Bucket] = deque()
        self.level = 0
        self.last_t: float | None = None

    def bucket(self, t: float) -> _Bucket:
        return self._newest(math.floor(t / self._width))

    def _newest(self, index: int) -> _Bucket:
        buckets = self._buckets
        if buckets and buckets[-1].index >= index:
            # Late events go to the newest bucket rather than reopening an old one.
            return buckets[-1]
        buckets.append(_Bucket(index))
        while buckets and buckets[0].index <= index - self._n:
            buckets.popleft()
        return buckets[-1]

    def advance(self, t: float) -> None:
        """Credits the time since the last event to the current level, bucket by bucket."""
        last_t = self.last_t
        if last_t is None:
            self.last_t = t
            return
        buckets = self._buckets
        width = self._width
        if (
            buckets
            and last_t <= t
            and math.floor(t / width) == buckets[-1].index == math.floor(last_t / width)
        ):
            # The usual case: this event and the last one in the newest bucket.
            level_seconds = buckets[-1].level_seconds
            level_seconds[self.level] = level_seconds.get(self.level, 0.0) + (t - last_t)
            self.last_t = t
            return
        start = max(last_t, t - self._n * width)
        if start < t:
            # Stepped by bucket index, not by time: a width such as 0.1 or 1.3 is not exact in
            # binary, (index + 1) * width can round to `start` itself, and a walk by time
            # then never moved on (the event loop hung).
            last = math.floor(t / width)
            for index in range(math.floor(start / width), last + 1):
                end = t if index == last else min(t, (index + 1) * width)
                if end <= start:
                    continue
                b = self._bucket_at(index)
                level_seconds = b.level_seconds
                level_seconds[self.level] = level_seconds.get(self.level, 0.0) + (end - start)
                start = end
        self.last_t = max(last_t, t)

    def _bucket_at(self, index: int) -> _Bucket:
        """The bucket of exactly this index, inserted in order if missing. In-flight time
        goes where it was spent: a sample or scrape may have opened a newer bucket since
        the last request event, and the newest bucket would take time from before the
        window. (Samples do not advance the level: they come in after request events that
        are still queued, whose time would then be lost.)"""
        buckets = self._buckets
        if not buckets or buckets[-1].index < index:
            return self._newest(index)
        for position in range(len(buckets) - 1, -1, -1):
            found = buckets[position]
            if found.index == index:
                return found
            if found.index < index:
                buckets.insert(position + 1, _Bucket(index))
                return buckets[position + 1]
        buckets.appendleft(_Bucket(index))
        return buckets[0]

    def window(self, now: float) -> list[_Bucket]:
        lowest = math.floor(now / self._width) - self._n
        return [b for b in self._buckets if b.index > lowest]


@dataclass
class _Tier:
    unbounded: PrefixCacheReplay
    lru: PrefixCacheReplay
    precision: str | None = None
    eta: float = 1.0
    # Counters are per engine: each replica is diffed against its own last scrape, never
    # against a sibling's (whose lower counts would read as a restart).
    prev_snapshots: dict[str, VllmMetricsSnapshot] = field(default_factory=dict)
    endpoints: int = 1
    engines_per_endpoint: int = 1  # data parallel: several engines behind one endpoint
    tenants: set[str] = field(default_factory=set)
    # The engine's cache in replay blocks; the LRU replay holds `sample_rate` of it.
    capacity_blocks: int | None = None
    sample_rate: float = 1.0

    def set_capacity(self, capacity_blocks: int | None, sample_rate: float) -> None:
        self.capacity_blocks, self.sample_rate = capacity_blocks, sample_rate
        self.lru.set_capacity(scaled_capacity(capacity_blocks, sample_rate))


@dataclass(frozen=True)
class ConcurrencySummary:
    """`mean`/`p50`/`p95`/`max`: the gateway's in-flight count for the whole tier;
    `engine_mean`: running + waiting per engine at scrape instants; `endpoints`: engines
    serving (replicas times the data-parallel engines behind each)."""

    mean: float | None
    p50: float | None
    p95: float | None
    max: float | None
    engine_mean: float | None
    endpoints: int = 1


def per_engine_concurrency(
    gateway_mean: float | None, engine_mean: float | None, endpoints: int | None = 1
) -> float | None:
    """C for the cost model: in-flight requests per backend (c.1), since K and B_eff are per
    engine. The gateway's mean is exact for its own traffic but covers the whole tier, so it
    is split over the replicas serving; the engines' running + waiting also sees other
    clients but only at scrape instants. The larger of the two; None when neither is known."""
    per_replica = None if gateway_mean is None else gateway_mean / max(1, endpoints or 1)
    known = [c for c in (per_replica, engine_mean) if c is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class RhoSummary:
    unbounded: float | None
    lru: float | None
    engine: float | None
    sampled_tokens: int
    capacity_blocks: int | None  # the engine's; the LRU replay holds sample_rate of it
    sample_rate: float = 1.0  # the rate of the latest sampled prompt


@dataclass(frozen=True)
class RSummary:
    r_iid: float | None  # replayed on the served tier's completions: eta(p) * r
    r_pos: float | None
    r_round: float | None
    A_sim: float | None
    cover: float | None
    rounds: int
    a_obs: float | None
    r_engine: float | None
    # r_iid / eta(p): the reference-precision r the cost model defines, as r_engine is.
    r_reference: float | None = None


@dataclass(frozen=True)
class RegimeReport:
    """The regime of one tier (tenant "*" = all tenants) over [now - window_s, now]."""

    tier: str
    tenant: str
    precision: str | None
    now: float
    window_s: float
    concurrency: ConcurrencySummary
    rho: RhoSummary
    r: RSummary
    l_in: float | None
    l_out: float | None

    def to_dict(self) -> dict[str, Any]:
        """The `/admin/regime` shape per tier."""
        return {
            "precision": self.precision,
            "tenant": self.tenant,
            "window_s": self.window_s,
            "concurrency": asdict(self.concurrency),
            "rho": asdict(self.rho),
            "r": asdict(self.r),
            "lengths": {"l_in": self.l_in, "l_out": self.l_out},
        }


def _time_weighted(levels: dict[int, float]) -> ConcurrencySummary:
    total = sum(levels.values())
    if total <= 0:
        return ConcurrencySummary(None, None, None, None, None)
    ordered = sorted(levels.items())

    def quantile(q: float) -> float:
        acc = 0.0
        for level, seconds in ordered:
            acc += seconds
            if acc >= q * total * (1.0 - 1e-12):
                return float(level)
        return float(ordered[-1][0])

    mean = sum(level * seconds for level, seconds in ordered) / total
    peak = max(level for level, seconds in ordered if seconds > 0)
    return ConcurrencySummary(mean, quantile(0.5), quantile(0.95), float(peak), None)


class RegimeTracker:
    """Per-(tier, tenant) rolling regime; see the module docstring. Not thread-safe: feed it
    from one task."""

    def __init__(self, config: TrackerConfig | None = None) -> None:
        self.config = config or TrackerConfig()
        self._n_buckets = math.ceil(self.config.window_s / self.config.bucket_s)
        self._series: dict[tuple[str, str], _Series] = {}
        self._pairs: dict[tuple[str, str], tuple[_Series, _Series]] = {}
        self._tiers: dict[str, _Tier] = {}

    # -- configuration ------------------------------------------------------------------

    def configure_tier(
        self,
        tier: str,
        *,
        precision: str | None = None,
        capacity_blocks: int | None = None,
        eta: float | None = None,
        endpoints: int | None = None,
    ) -> None:
        """Precision and eta (for the engine-side r), the LRU bound in blocks, and the number
        of replicas serving the tier (splits the gateway's in-flight count per engine)."""
        state = self._tier(tier)
        if precision is not None:
            state.precision = precision
        if eta is not None:
            state.eta = eta
        if capacity_blocks is not None:
            state.set_capacity(capacity_blocks, state.sample_rate)
        if endpoints is not None:
            state.endpoints = max(1, endpoints)

    def retain_endpoints(self, tier: str, endpoints: Iterable[str]) -> None:
        """Forgets the last scrape of replicas no longer in the tier, so one that comes back
        later starts afresh instead of adding all it counted while away to one bucket."""
        state = self._tier(tier)
        keep = set(endpoints)
        state.prev_snapshots = {e: s for e, s in state.prev_snapshots.items() if e in keep}

    def tiers(self) -> list[str]:
        return sorted(self._tiers)

    def tenants(self, tier: str) -> list[str]:
        return sorted(self._tiers[tier].tenants) if tier in self._tiers else []

    # -- events -------------------------------------------------------------------------

    def request_started(self, tier: str, tenant: str, now: float) -> None:
        for series in self._both(tier, tenant):
            series.advance(now)
            series.level += 1

    def request_finished(self, tier: str, tenant: str, now: float) -> None:
        for series in self._both(tier, tenant):
            series.advance(now)
            series.level = max(0, series.level - 1)

    def prompt_sampled(
        self,
        tier: str,
        tenant: str,
        now: float,
        prompt_ids: Sequence[int],
        sample_rate: float = 1.0,
        *,
        cache_salt: str | None = None,
    ) -> None:
        """A sampled prompt (token ids as the engine sees them, chat template included),
        taken at `sample_rate` by a hash of its conversation: the LRU replay is bounded by
        that share of the engine's cache. When the rate changes, the bound follows it (a
        lower one evicts at once; a higher one fills as the newly sampled traffic comes).
        `cache_salt` is the namespace it was served in: its blocks hit only that one's, as
        at the engine (c.1)."""
        state = self._tier(tier)
        if sample_rate != state.sample_rate:
            state.set_capacity(state.capacity_blocks, sample_rate)
        salt = salt_key(cache_salt)
        hit_unbounded = state.unbounded.lookup_and_insert(prompt_ids, salt)
        hit_lru = state.lru.lookup_and_insert(prompt_ids, salt)
        for series in self._both(tier, tenant):
            b = series.bucket(now)
            b.prompts += 1
            b.prompt_tokens += len(prompt_ids)
            b.hits_unbounded += hit_unbounded
            b.hits_lru += hit_lru

    def completion_sampled(
        self,
        tier: str,
        tenant: str,
        now: float,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
    ) -> None:
        """A sampled (prompt, completion) pair; replayed at once (O(len) work). The answer's
        blocks enter the prefix-cache replays, as the engine caches them."""
        state = self._tier(tier)
        salt = salt_key(cache_salt)
        state.unbounded.cache_generated(prompt_ids, completion_ids, salt)
        state.lru.cache_generated(prompt_ids, completion_ids, salt)
        cfg = self.config
        counts = replay_pair(
            prompt_ids, completion_ids, cfg.min_n, cfg.max_n, cfg.num_speculative_tokens
        )
        for series in self._both(tier, tenant):
            b = series.bucket(now)
            b.ngram = b.ngram + counts
            b.completions += 1
            b.completion_tokens += len(completion_ids)

    def engine_snapshot(
        self, tier: str, now: float, snapshot: VllmMetricsSnapshot, *, endpoint: str
    ) -> None:
        """A scrape of one endpoint's `/metrics`; its counters enter as deltas from that
        endpoint's previous scrape, so the tier's deltas are the sum over its replicas."""
        state = self._tier(tier)
        state.engines_per_endpoint = snapshot.engines
        cache = snapshot.cache_config
        if cache is not None and cache.num_gpu_blocks is not None:
            # num_gpu_blocks is in engine blocks; convert if the replay's size differs.
            size = cache.block_size or self.config.block_size
            capacity = cache.num_gpu_blocks * size // self.config.block_size
            state.set_capacity(capacity, state.sample_rate)
        b = self._get_series(tier, ALL_TENANTS).bucket(now)
        if snapshot.concurrency is not None:
            b.engine_c_sum += snapshot.concurrency
            b.engine_c_samples += 1
        previous = state.prev_snapshots.get(endpoint)
        if previous is not None:
            b.engine = b.engine + counter_deltas(previous, snapshot)
        state.prev_snapshots[endpoint] = snapshot

    # -- reports ------------------------------------------------------------------------

    def report(self, tier: str, now: float, tenant: str | None = None) -> RegimeReport:
        """The regime over the window ending at `now`; None fields mean "no data"."""
        key_tenant = ALL_TENANTS if tenant is None else self._fold(tier, tenant, create=False)
        state = self._tier(tier)
        # Reporting on a tenant never seen must not allocate a series for it.
        series = self._series.get((tier, key_tenant)) or _Series(
            self._n_buckets, self.config.bucket_s
        )
        series.advance(now)
        buckets = series.window(now)

        levels: dict[int, float] = {}
        ngram = NgramCounts()
        engine = CounterDeltas()
        prompt_tokens = prompts = hits_u = hits_l = comp_tokens = comps = 0
        c_sum, c_n = 0.0, 0
        for b in buckets:
            for level, seconds in b.level_seconds.items():
                levels[level] = levels.get(level, 0.0) + seconds
            ngram = ngram + b.ngram
            engine = engine + b.engine
            prompt_tokens += b.prompt_tokens
            prompts += b.prompts
            hits_u += b.hits_unbounded
            hits_l += b.hits_lru
            comp_tokens += b.completion_tokens
            comps += b.completions
            c_sum += b.engine_c_sum
            c_n += b.engine_c_samples
        conc = _time_weighted(levels)
        conc = ConcurrencySummary(
            conc.mean,
            conc.p50,
            conc.p95,
            conc.max,
            c_sum / c_n if c_n else None,
            state.endpoints * state.engines_per_endpoint,
        )
        rho = RhoSummary(
            unbounded=hits_u / prompt_tokens if prompt_tokens else None,
            lru=hits_l / prompt_tokens if prompt_tokens else None,
            engine=engine.rho if tenant is None else None,
            sampled_tokens=prompt_tokens,
            capacity_blocks=state.capacity_blocks,
            sample_rate=state.sample_rate,
        )
        r = self._r_summary(ngram, engine if tenant is None else CounterDeltas(), state.eta)
        l_in = engine.l_in if tenant is None and engine.l_in is not None else None
        l_out = engine.l_out if tenant is None and engine.l_out is not None else None
        return RegimeReport(
            tier=tier,
            tenant=key_tenant,
            precision=state.precision,
            now=now,
            window_s=self.config.window_s,
            concurrency=conc,
            rho=rho,
            r=r,
            l_in=l_in if l_in is not None else (prompt_tokens / prompts if prompts else None),
            l_out=l_out if l_out is not None else (comp_tokens / comps if comps else None),
        )

    def report_all(self, now: float) -> dict[str, Any]:
        """`{"tiers": {tier: report}}` over all tenants, the `/admin/regime` body."""
        return {"tiers": {t: self.report(t, now).to_dict() for t in self.tiers()}}

    # -- internals ----------------------------------------------------------------------

    def _r_summary(self, ngram: NgramCounts, engine: CounterDeltas, eta: float) -> RSummary:
        k = self.config.num_speculative_tokens
        s = ngram.summary(k) if ngram.rounds else None
        a_obs = engine.tokens_per_round
        r_engine = None
        if a_obs is not None and eta > 0:
            r_engine = min(1.0, inverse_accepted_per_round(a_obs, k) / eta)
        r_iid = s["r_iid"] if s else None
        return RSummary(
            r_iid=r_iid,
            r_pos=s["r_pos"] if s else None,
            r_round=s["r_round"] if s else None,
            A_sim=s["A_sim"] if s else None,
            cover=s["cover"] if s else None,
            rounds=ngram.rounds,
            a_obs=a_obs,
            r_engine=r_engine,
            # The sampled completions came from this tier, whose acceptance is eta * r (c.1);
            # undone here, as for the engine's counters, so both sources plan on one r.
            r_reference=min(1.0, r_iid / eta) if r_iid is not None and eta > 0 else None,
        )

    def _tier(self, tier: str) -> _Tier:
        state = self._tiers.get(tier)
        if state is None:
            cfg = self.config
            state = _Tier(
                unbounded=PrefixCacheReplay(cfg.block_size, cfg.max_replay_blocks),
                lru=PrefixCacheReplay(cfg.block_size, None),
            )
            self._tiers[tier] = state
        return state

    def _fold(self, tier: str, tenant: str, *, create: bool = True) -> str:
        # Past max_tenants_per_tier new tenants share one series, which bounds memory.
        known = self._tier(tier).tenants
        if tenant in known or tenant == ALL_TENANTS:
            return tenant
        if len(known) >= self.config.max_tenants_per_tier:
            known.add(OTHER_TENANTS)
            return OTHER_TENANTS
        if create:
            known.add(tenant)
        return tenant

    def _get_series(self, tier: str, tenant: str) -> _Series:
        key = (tier, tenant)
        series = self._series.get(key)
        if series is None:
            series = _Series(self._n_buckets, self.config.bucket_s)
            self._series[key] = series
        return series

    def _both(self, tier: str, tenant: str) -> tuple[_Series, _Series]:
        # Called twice per request: the pair is cached (a tenant's fold never changes), only
        # for tenants with their own series, so the cache is bounded like the series.
        pair = self._pairs.get((tier, tenant))
        if pair is None:
            folded = self._fold(tier, tenant)
            pair = (self._get_series(tier, folded), self._get_series(tier, ALL_TENANTS))
            if folded == tenant:
                self._pairs[(tier, tenant)] = pair
        return pair
