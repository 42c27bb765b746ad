"""The live regime observer: feeds the pure estimators from traffic and tier /metrics, runs
the planner per tier, and exports the regime, the recommendation and flag drift.

On the request path it only counts in-flight requests and, for a sampled share, puts the
relayed bytes on a bounded queue (a full queue drops the sample). Requests are sampled by a
stable hash of their conversation's root (`sampling_key`), so a sampled conversation is
replayed whole and the replay sees the prefix sharing the engine sees. Everything else runs in
background tasks: tokenizing samples through the tier's own /tokenize (so token ids match
the engine's, chat template included), scraping /metrics, planning.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.backends.tier import EndpointState, TierBackend
from gateway.config import Settings
from gateway.live import upstream
from gateway.metrics import GatewayMetrics
from gateway.observer.completions import completion_texts
from gateway.observer.regime import (
    RegimeReport,
    RegimeTracker,
    TrackerConfig,
    per_engine_concurrency,
)
from gateway.observer.sampling_key import (
    ArrivalRate,
    budget_rate,
    held_rate,
    is_sampled,
    request_key_hash,
)
from gateway.observer.vllm_metrics import VllmMetricsSnapshot, parse_vllm_metrics
from gateway.periods import sleep_period
from gateway.planner.costmodel import CostModel
from gateway.planner.params import Settings as PlannerSettings
from gateway.planner.planner import (
    MIN_CONCURRENCY,
    Planner,
    PlannerStep,
    PlanningError,
    Regime,
    TierConfig,
    fixed_precision_settings,
    with_engine_kv_capacity,
)
from gateway.precision import Precision
from gateway.protocol import EndpointKind
from gateway.sample_queue import SampleQueue
from gateway.stats import CompletedExchange
from gateway.tenants.limits import TokenBucket

log = logging.getLogger("tiergate.observer")

FLAGS = ("speculative_decoding", "prefix_caching")


@dataclass(frozen=True, slots=True)
class Sample:
    tier: str
    tenant: str
    request: dict[str, Any]
    body: bytes
    at: float
    rate: float = 1.0  # the sampling rate it was taken at (scales the LRU replay)
    kind: EndpointKind = "chat"  # the endpoint it came to: which field the engine read
    cache_salt: str | None = None  # its prefix-cache namespace at the engine (None: shared)


@dataclass(slots=True)
class RunningFlags:
    """What a tier runs with, as far as the gateway can tell (None: unknown)."""

    speculative: bool | None = None
    prefix_caching: bool | None = None

    def as_tuple(self) -> tuple[bool | None, bool | None]:
        return self.speculative, self.prefix_caching

    def config(self, precision: Precision, assumed: TierConfig | None = None) -> TierConfig | None:
        """The running configuration. When one flag is seen, the other is taken from
        `assumed` (the planner's own view), so the seen one is still followed; None when
        neither is seen (the planner then plans as offline, on its own advice)."""
        speculative, prefix_caching = self.speculative, self.prefix_caching
        if speculative is None and prefix_caching is None:
            return None
        if assumed is not None:
            speculative = assumed.speculative if speculative is None else speculative
            prefix_caching = assumed.prefix_caching if prefix_caching is None else prefix_caching
        if speculative is None or prefix_caching is None:
            return None
        return TierConfig(precision, speculative, prefix_caching)


def _option_name(arg: str) -> str:
    """The option an argument names, as vLLM's FlexibleArgumentParser reads it: `_` and `-`
    are the same in a long option (`--no_enable_prefix_caching`), and `--speculative-config.
    method ngram` sets one key of that option."""
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name.split(".", 1)[0]


def flags_from_args(args: Sequence[str]) -> RunningFlags:
    """The toggles a `vllm serve` argument list sets (vLLM defaults: APC on, no speculation)."""
    flags = RunningFlags(speculative=False, prefix_caching=True)
    for arg in args:
        name = _option_name(arg)
        if name == "--no-enable-prefix-caching":
            flags.prefix_caching = False
        elif name == "--enable-prefix-caching":
            flags.prefix_caching = True
        elif name in {"--speculative-config", "-sc"}:
            flags.speculative = True
    return flags


def flags_from_snapshot(snapshot: VllmMetricsSnapshot) -> RunningFlags:
    cache = snapshot.cache_config
    return RunningFlags(
        # spec-decode counters exist only on an engine that speculates
        speculative=snapshot.spec_decode_num_drafts is not None,
        prefix_caching=None if cache is None else cache.enable_prefix_caching,
    )


def first_prompt(request: dict[str, Any], kind: EndpointKind) -> str | list[int] | None:
    """The prompt of a sampled request that choice 0 answers: None for chat (its messages),
    the text or token ids of a completions prompt, the first of a list of prompts."""
    if kind == "chat":
        return None
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, list):
        return [int(token) for token in prompt]
    return str(prompt)


# What the chat template renders besides the messages; vLLM's /tokenize takes the same names.
# A tool schema is often the longest prefix requests share: left out, rho would miss it.
CHAT_TEMPLATE_FIELDS = (
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
)


def chat_template_fields(request: dict[str, Any]) -> dict[str, Any]:
    """The fields of a chat request that shape its prompt tokens, for its /tokenize call."""
    return {key: request[key] for key in CHAT_TEMPLATE_FIELDS if request.get(key) is not None}


def _choices(request: dict[str, Any]) -> int:
    """The engine requests one client request becomes (`n`, validated upstream of here)."""
    n = request.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def _known_flags(running: RunningFlags) -> dict[str, bool] | None:
    """What the tier runs, for `plan --from-gateway` to keep an unmeasured toggle as it is;
    None unless both flags are known (a half-known configuration is not one to keep)."""
    if running.speculative is None or running.prefix_caching is None:
        return None
    return {"speculative": running.speculative, "prefix_caching": running.prefix_caching}


def serving_endpoints(tier: TierBackend) -> int:
    """Replicas the tier's traffic is spread over: the healthy ones (all while none is)."""
    healthy = sum(1 for e in tier.endpoints if e.healthy)
    return max(1, healthy or len(tier.endpoints))


def agreed_flags(seen: Iterable[RunningFlags]) -> RunningFlags:
    """The tier's flags from its endpoints': a flag is known when every endpoint agrees."""
    flags = list(seen)
    speculative = {f.speculative for f in flags}
    prefix_caching = {f.prefix_caching for f in flags}
    return RunningFlags(
        speculative=speculative.pop() if len(speculative) == 1 else None,
        prefix_caching=prefix_caching.pop() if len(prefix_caching) == 1 else None,
    )


def regime_of(report: RegimeReport, *, engine_r_usable: bool = True) -> Regime | None:
    """The planner's input from a report, preferring engine counters where they exist
    (b.1 step 1); None while the tier has seen no traffic. `engine_r_usable` is False when
    the tier may run a per-batch speculation table (d.5): rounds at a k = 0 batch draft
    nothing, so the engine's acceptance understates r and would argue speculation off."""
    conc = report.concurrency
    c = per_engine_concurrency(conc.mean, conc.engine_mean, conc.endpoints)
    if c is None or c < MIN_CONCURRENCY:
        return None
    rho = report.rho.engine if report.rho.engine is not None else report.rho.lru
    r_engine = report.r.r_engine if engine_r_usable else None
    r = r_engine if r_engine is not None else report.r.r_reference
    # Unmeasured (no sampled request, no engine counter): a stand-in of 0 that the planner
    # knows is one, so the flag it decides is not advised on it.
    return Regime(
        concurrency=c,
        rho=min(1.0, max(0.0, rho or 0.0)),
        r=min(1.0, max(0.0, r or 0.0)),
        l_in=report.l_in or None,
        l_out=report.l_out or None,
        rho_known=rho is not None,
        r_known=r is not None,
    )


@dataclass(slots=True)
class _TierState:
    tier: TierBackend
    tracker: RegimeTracker
    planner: Planner
    running: RunningFlags = field(default_factory=RunningFlags)
    # Flags last scraped per endpoint: replicas that disagree (a rolling restart) leave the
    # tier's flag unknown instead of flipping it with every scrape.
    endpoint_flags: dict[str, RunningFlags] = field(default_factory=dict)
    last_step: PlannerStep | None = None
    last_regime: Regime | None = None
    note: str = "not planned yet (the first plan comes after observer.plan_interval_s)"
    # KV tokens the tier's engines hold (the least of its replicas' cache_config_info):
    # the planner's K comes from it once scraped.
    engine_kv_tokens: float | None = None
    # Last reported per endpoint: a replica missing one scrape keeps bounding the tier's K
    # (else K would rise to the others' and replan, resetting confirmations, on every miss).
    endpoint_kv_tokens: dict[str, int] = field(default_factory=dict)


class LiveObserver:
    """One per gateway; implements ExchangeListener for the proxy."""

    def __init__(
        self,
        settings: Settings,
        metrics: GatewayMetrics,
        tiers: Callable[[], Sequence[TierBackend]],
        clock: Callable[[], float] = time.monotonic,
        *,
        workers: int = 1,
    ) -> None:
        self.metrics = metrics
        self.tiers = tiers
        self.clock = clock
        # Under `serve --workers N` this process sees about 1/N of the traffic: its samples
        # cap is its share of max_samples_per_s, and its replay holds that share of the
        # engine's cache (the sampled share of the traffic it replays is rate / N).
        self.workers = max(1, workers)
        self.dropped = 0
        self.processed = 0
        self._queue: SampleQueue[Sample] | None = None
        self._states: dict[str, _TierState] = {}
        # Kept across reloads: traffic does not change with the file, and a fresh estimate
        # (0) would put the threshold back at sample_rate until it caught up (a few tau_s).
        self._arrivals = ArrivalRate()
        self.rate = self.effective_rate = -1.0  # set by _read_settings
        # In-flight events, appended on the request path and replayed by a background task;
        # bounded, so a stalled task costs accuracy, never memory.
        self._events: deque[tuple[float, str, str, bool]] = deque(maxlen=200_000)
        self._read_settings(settings)

    def _read_settings(self, settings: Settings) -> None:
        self.settings = settings
        self.observer = settings.observer
        self.enabled = settings.observer.enabled
        rate = settings.observer.sample_rate if self.enabled else 0.0
        cap = self._samples_cap(settings)
        # The budget lowers the hash threshold (effective_rate) as traffic grows; the
        # bucket is only a hard cap for bursts the arrival rate has not caught up with.
        self._sample_budget = TokenBucket(cap, max(1.0, cap), self.clock)
        if rate == self.rate:  # an edit that leaves the rate alone keeps the sampled set
            self.effective_rate = held_rate(self.effective_rate, rate, self._arrivals.per_s, cap)
        else:
            self.effective_rate = budget_rate(rate, self._arrivals.per_s, cap)
        self.rate = rate

    def _samples_cap(self, settings: Settings) -> float:
        return settings.observer.max_samples_per_s / self.workers

    # -- configuration ---------------------------------------------------------------------
    def configure(self, settings: Settings) -> None:
        """(Re)reads the settings and the current tiers; a tier whose name and precision are
        unchanged keeps its history and planner state, unless the observer is turned off or
        on."""
        was_enabled = self.enabled
        self._read_settings(settings)
        if self.enabled != was_enabled:
            # Requests in flight across the switch have only one of their two events: the
            # in-flight level they left behind would never come back down.
            self._events.clear()
            self._states = {}
        states = {}
        for tier in self.tiers():
            kept = self._states.get(tier.name)
            if kept is not None and kept.tier.settings.precision == tier.settings.precision:
                # Replicas removed by the reload are gone; URLs as the scraper keys them.
                urls = {e.url for e in tier.settings.parsed_endpoints}
                kept.endpoint_flags = {u: f for u, f in kept.endpoint_flags.items() if u in urls}
                kept.endpoint_kv_tokens = {
                    u: t for u, t in kept.endpoint_kv_tokens.items() if u in urls
                }
                # None once no kept replica has reported: K goes back to the estimate.
                kept.engine_kv_tokens = min(kept.endpoint_kv_tokens.values(), default=None)
                kept.tracker.retain_endpoints(tier.name, urls)
                if tier.settings.vllm_args is not None:  # the operator says what runs now
                    kept.running = flags_from_args(tier.settings.vllm_args)
                else:
                    kept.running = agreed_flags(kept.endpoint_flags.values())
                kept.tier = tier
                planner_settings = self._planner_settings(kept)
                if kept.planner.settings != planner_settings:  # e.g. new hardware or policy
                    kept.planner.reconfigure(planner_settings)
                    eta = CostModel.from_settings(settings.planner).eta(tier.settings.precision)
                    kept.tracker.configure_tier(tier.name, eta=eta)
                block_size = kept.tracker.config.block_size  # the engine's, once scraped
                if kept.tracker.config != self._tracker_config(block_size):
                    # A new window, bucket or n-gram setting: the kept buckets were sized and
                    # counted under the old one, and would go on reporting it.
                    kept.tracker = self._new_state(tier, block_size).tracker
                states[tier.name] = kept
                continue
            states[tier.name] = self._new_state(tier, settings.planner.serve.block_size)
        self._states = states

    def _planner_settings(self, state: _TierState) -> PlannerSettings:
        return with_engine_kv_capacity(
            fixed_precision_settings(self.settings.planner),
            state.tier.settings.precision,
            state.engine_kv_tokens,
        )

    def _tracker_config(self, block_size: int) -> TrackerConfig:
        planner = self.settings.planner
        return TrackerConfig(
            window_s=self.observer.window_s,
            bucket_s=min(self.observer.bucket_s, self.observer.window_s),
            block_size=block_size,
            min_n=planner.serve.prompt_lookup_min,
            max_n=planner.serve.prompt_lookup_max,
            num_speculative_tokens=planner.cost.num_speculative_tokens,
        )

    def _new_state(self, tier: TierBackend, block_size: int) -> _TierState:
        planner = self.settings.planner
        tracker = RegimeTracker(self._tracker_config(block_size))
        precision = tier.settings.precision
        model = CostModel.from_settings(planner)
        tracker.configure_tier(
            tier.name,
            precision=precision,
            capacity_blocks=int(model.kv_capacity_tokens(precision) // block_size),
            eta=model.eta(precision),
        )
        # The routing ladder fixes a live tier's precision: only its toggles are planned.
        toggles_only = Planner(fixed_precision_settings(planner), candidates=[precision])
        state = _TierState(tier, tracker, toggles_only)
        if tier.settings.vllm_args is not None:
            state.running = flags_from_args(tier.settings.vllm_args)
        return state

    # -- ExchangeListener (request path: cheap, never raises) --------------------------------
    def wants_capture(
        self, tenant: str, tier: int, request: dict[str, Any], kind: EndpointKind
    ) -> bool:
        if self.rate <= 0.0:
            return False
        if self._arrivals.arrived(self.clock()):
            cap = self._samples_cap(self.settings)
            per_s = self._arrivals.per_s
            self.effective_rate = held_rate(self.effective_rate, self.rate, per_s, cap)
        if not is_sampled(request_key_hash(request, kind), self.effective_rate):
            return False
        return self._sample_budget.try_take(1.0) == 0.0

    def upstream_started(self, tier: str, tenant: str) -> None:
        if self.enabled:
            self._events.append((self.clock(), tier, tenant, True))

    def upstream_finished(self, tier: str, tenant: str) -> None:
        if self.enabled:
            self._events.append((self.clock(), tier, tenant, False))

    def drain_events(self) -> None:
        """Replays in-flight events into the trackers (time-weighted concurrency)."""
        events = self._events
        while events:
            at, tier, tenant, started = events.popleft()
            state = self._states.get(tier)
            if state is None:
                continue
            if started:
                state.tracker.request_started(tier, tenant, at)
            else:
                state.tracker.request_finished(tier, tenant, at)

    def exchange_done(self, exchange: CompletedExchange) -> None:
        if self._queue is None:
            return
        # The rate may have dropped since capture (the budget, or a reload that lowered
        # sample_rate or turned the observer off): a conversation no longer sampled would be
        # replayed under a bound that leaves it out (at rate 0, one block).
        if not is_sampled(request_key_hash(exchange.request, exchange.kind), self.effective_rate):
            return
        sample = Sample(
            exchange.tier,
            exchange.tenant,
            exchange.request,
            exchange.body,
            self.clock(),
            # The rate now, which samples this conversation too (a higher one samples a
            # superset): the replay is bounded for the set it now receives, this worker's
            # share of it.
            self.effective_rate / self.workers,
            exchange.kind,
            exchange.cache_salt,
        )
        if not self._queue.offer(sample, exchange.size, self.observer.queue_size):
            self.dropped += 1

    # -- background work ---------------------------------------------------------------------
    def start(self) -> list[asyncio.Task[None]]:
        self._queue = SampleQueue()
        loop = asyncio.get_running_loop()
        return [
            loop.create_task(self._every(lambda: 0.25, self._drain_async)),
            loop.create_task(self._consume()),
            loop.create_task(
                self._every(lambda: self.observer.scrape_interval_s, self.scrape_once)
            ),
            loop.create_task(self._every(lambda: self.observer.plan_interval_s, self._plan_async)),
        ]

    async def _every(self, period_s: Callable[[], float], work: Callable[[], Any]) -> None:
        while True:
            await sleep_period(period_s)  # a reload may change it meanwhile
            try:
                await work()
            except Exception:  # a background failure must never stop the loop
                log.exception("observer task failed")

    async def _plan_async(self) -> None:
        self.plan_once()

    async def _drain_async(self) -> None:
        self.drain_events()

    async def _consume(self) -> None:
        assert self._queue is not None
        while True:
            sample = await self._queue.take()
            try:
                await self.process(sample)
            except Exception:
                log.exception("dropping a regime sample")

    async def process(self, sample: Sample) -> None:
        """Tokenizes one sample through its tier and feeds the replay estimators."""
        state = self._states.get(sample.tier)
        if state is None:
            return
        endpoint = next((e for e in state.tier.endpoints if e.healthy), None)
        if endpoint is None:
            return
        served = state.tier.served_model_name
        request = sample.request
        prompt = first_prompt(request, sample.kind)
        if isinstance(prompt, list):
            prompt_ids: list[int] | None = prompt  # already token ids
        else:
            query: dict[str, Any] = {"model": served}
            if prompt is None:
                query["messages"] = request["messages"]
                query |= chat_template_fields(request)
            else:
                query["prompt"] = prompt
            prompt_ids = await upstream.tokenize(endpoint, query)
        texts = completion_texts(sample.body)
        completion_ids = (
            await upstream.tokenize(
                endpoint, {"model": served, "prompt": texts[0], "add_special_tokens": False}
            )
            if texts and texts[0]
            else None
        )
        if not prompt_ids:
            return
        tracker = state.tracker
        # vLLM looks each of n choices up on its own: the later ones hit the first's blocks.
        for _ in range(_choices(request)):
            tracker.prompt_sampled(
                sample.tier,
                sample.tenant,
                sample.at,
                prompt_ids,
                sample.rate,
                cache_salt=sample.cache_salt,
            )
        if completion_ids:
            tracker.completion_sampled(
                sample.tier,
                sample.tenant,
                sample.at,
                prompt_ids,
                completion_ids,
                cache_salt=sample.cache_salt,
            )
        self.processed += 1

    async def scrape_once(self) -> None:
        now = self.clock()
        for name, state in self._states.items():
            for endpoint in state.tier.endpoints:
                snapshot = await self._scrape(name, state.tier, endpoint)
                if snapshot is None:
                    continue
                self._adopt_block_size(state, snapshot)
                url = endpoint.endpoint.url
                state.tracker.engine_snapshot(name, now, snapshot, endpoint=url)
                state.endpoint_flags[url] = flags_from_snapshot(snapshot)
                tokens = _engine_kv_tokens(snapshot)
                if tokens is not None:
                    state.endpoint_kv_tokens[url] = tokens
            if state.tier.settings.vllm_args is None and state.endpoint_flags:
                state.running = agreed_flags(state.endpoint_flags.values())
            self._adopt_kv_capacity(state, min(state.endpoint_kv_tokens.values(), default=None))

    async def _scrape(
        self, name: str, tier: TierBackend, endpoint: EndpointState
    ) -> VllmMetricsSnapshot | None:
        """One engine's /metrics, its outcome counted: an engine whose counters never arrive
        (unreachable, another served model name) would otherwise only show as a regime
        without engine figures."""
        text = await upstream.get(endpoint, b"/metrics")
        snapshot = None
        if text is None:
            outcome = "failed"
        else:
            try:
                snapshot = parse_vllm_metrics(text.decode(), tier.served_model_name)
            except ValueError:  # UnicodeDecodeError included
                outcome = "unparsable"
            else:
                outcome = "ok" if snapshot.num_requests_running is not None else "no_model"
        self.metrics.engine_scrapes.labels(name, endpoint.endpoint.url, outcome).inc()
        return snapshot

    def _adopt_kv_capacity(self, state: _TierState, tokens: int | None) -> None:
        # The least replica bounds the batch a request can count on; a change (an engine
        # restarted with another memory budget) replans with the new knee.
        if tokens is None or tokens == state.engine_kv_tokens:
            return
        state.engine_kv_tokens = tokens
        settings = self._planner_settings(state)
        if state.planner.settings != settings:
            state.planner.reconfigure(settings)

    def _adopt_block_size(self, state: _TierState, snapshot: VllmMetricsSnapshot) -> None:
        # Replay must hash blocks of the engine's size (vLLM on CPU uses 128, on GPU 16).
        cache = snapshot.cache_config
        size = None if cache is None else cache.block_size
        if size and size != state.tracker.config.block_size:
            fresh = self._new_state(state.tier, size)
            state.tracker = fresh.tracker

    def plan_once(self) -> None:
        """One b.1 evaluation per tier; updates the gauges and the /admin/plan view. Tiers are
        planned independently: one that fails is logged and noted, the others still plan."""
        self.drain_events()
        now = self.clock()
        for name, state in self._states.items():
            try:
                self._plan_tier(name, state, now)
            except Exception as exc:  # a broken tier must not stop planning the others
                log.exception("planning tier %s failed", name)
                state.note = f"planning failed: {exc}"

    def _report(self, name: str, state: _TierState, now: float) -> RegimeReport:
        # C is per engine: the tracker splits the tier's in-flight count over its replicas.
        state.tracker.configure_tier(name, endpoints=serving_endpoints(state.tier))
        return state.tracker.report(name, now)

    def _plan_tier(self, name: str, state: _TierState, now: float) -> None:
        report = self._report(name, state, now)
        self._export_regime(name, report)
        per_batch_table = state.planner.settings.serve.batch_dependent_speculation
        regime = regime_of(report, engine_r_usable=not per_batch_table)
        if regime is None:
            state.note = "no traffic in the window"
            # No regime to judge the running flags against: no drift to alert on (the last
            # advice stays in `flag_recommended` and /admin/plan).
            for flag in FLAGS:
                self.metrics.flag_drift.labels(name, flag).set(0)
            return
        running_config = state.running.config(
            state.tier.settings.precision, assumed=state.planner.current
        )
        if running_config is not None:
            # Hysteresis, dwell and confirmations measure against what the tier runs.
            state.planner.follow(running_config, now)
        try:
            step = state.planner.step(now, regime)
        except PlanningError as exc:
            state.note = str(exc)
            return
        state.last_step, state.last_regime, state.note = step, regime, step.note
        self._export_plan(name, state, step, regime)

    def _export_plan(self, name: str, state: _TierState, step: PlannerStep, regime: Regime) -> None:
        metrics = self.metrics
        advice = step.advice
        recommended = (advice.speculative, advice.prefix_caching)
        running = state.running.as_tuple()
        model = CostModel.from_settings(state.planner.settings)  # the engine's K, once known
        metrics.expected_cpt.labels(name, "recommended").set(advice.expected_cpt)
        if None not in running:
            cost = model.cpt(
                regime.concurrency,
                regime.rho,
                regime.r,
                state.tier.settings.precision,
                bool(running[0]),
                bool(running[1]),
                l_in=regime.l_in,
                l_out=regime.l_out,
            )
            metrics.expected_cpt.labels(name, "running").set(cost)
        else:
            # Unknown now (replicas disagree mid-restart): a kept value would describe flags
            # the tier may no longer run, as /admin/plan's null says.
            metrics.drop_series(metrics.expected_cpt, {"tier": name, "config": "running"})
        for flag, wanted, actual in zip(FLAGS, recommended, running, strict=True):
            metrics.flag_recommended.labels(name, flag).set(1 if wanted else 0)
            if actual is None:
                metrics.drop_series(metrics.flag_running, {"tier": name, "flag": flag})
                metrics.drop_series(metrics.flag_drift, {"tier": name, "flag": flag})
            else:
                metrics.flag_running.labels(name, flag).set(1 if actual else 0)
                metrics.flag_drift.labels(name, flag).set(1 if actual != wanted else 0)

    def _export_regime(self, tier: str, report: RegimeReport) -> None:
        """The window's regime. A figure the window has no data for keeps its last value
        (NaN would poison the max and sum merged over `--workers`): the gauges read "last
        measured"; /admin/regime shows what the window holds."""
        metrics = self.metrics
        conc = report.concurrency
        for stat, value in (("mean", conc.mean), ("p50", conc.p50), ("p95", conc.p95)):
            if value is not None:
                metrics.regime_concurrency.labels(tier, stat).set(value)
        for source, value in (
            ("replay_unbounded", report.rho.unbounded),
            ("replay_lru", report.rho.lru),
            ("engine", report.rho.engine),
        ):
            if value is not None:
                metrics.regime_prefix_share.labels(tier, source).set(value)
        # The replay's r at reference precision, comparable with the engine's.
        for source, value in (("replay", report.r.r_reference), ("engine", report.r.r_engine)):
            if value is not None:
                metrics.regime_repetitiveness.labels(tier, source).set(value)

    # -- views for the admin API ---------------------------------------------------------------
    def regime_view(self) -> dict[str, Any]:
        self.drain_events()
        now = self.clock()
        return {
            "tiers": {
                name: {
                    **self._report(name, state, now).to_dict(),
                    "engine_kv_capacity_tokens": state.engine_kv_tokens,  # None: unreported
                    # What the planner's K comes from (a configured value wins over the
                    # engines'), which `plan --from-gateway` takes; None: the memory estimate.
                    "kv_capacity_tokens": state.planner.settings.cost.kv_capacity_tokens.get(
                        state.tier.settings.precision
                    ),
                    "current": _known_flags(state.running),
                }
                for name, state in self._states.items()
            },
            # The GPU the engines (and their KV capacities) are planned as: `plan
            # --from-gateway` for another one must not take this one's capacities.
            "hardware": self.settings.planner.hardware.name,
            "samples": {
                "processed": self.processed,
                "dropped": self.dropped,
                # The hash threshold now (sample_rate, lowered by the budget), and this
                # worker's share of the traffic.
                "effective_rate": max(self.effective_rate, 0.0),
                "workers": self.workers,
            },
        }

    def plan_view(self) -> dict[str, Any]:
        view: dict[str, Any] = {}
        for name, state in self._states.items():
            step = state.last_step
            running = state.running
            entry: dict[str, Any] = {
                "precision": state.tier.settings.precision,
                "note": state.note,
                # None: K comes from the memory estimate (no engine reported its KV blocks)
                "engine_kv_capacity_tokens": state.engine_kv_tokens,
                "running": {
                    "speculative": running.speculative,
                    "prefix_caching": running.prefix_caching,
                },
            }
            if step is not None and state.last_regime is not None:
                regime = state.last_regime
                plan = step.advice
                entry["regime"] = {
                    "concurrency": regime.concurrency,
                    # None: not measured yet, the flag it decides is kept as the tier runs it
                    "rho": regime.rho if regime.rho_known else None,
                    "r": regime.r if regime.r_known else None,
                }
                entry["action"] = step.action
                entry["recommended"] = plan.to_dict()
                if step.plan.config != plan.config:  # a better plan waits on hysteresis
                    entry["candidate"] = step.plan.to_dict()
                entry["drift"] = {
                    "speculative": None
                    if running.speculative is None
                    else running.speculative != plan.speculative,
                    "prefix_caching": None
                    if running.prefix_caching is None
                    else running.prefix_caching != plan.prefix_caching,
                }
            view[name] = entry
        return view


__all__ = [
    "LiveObserver",
    "RunningFlags",
    "Sample",
    "agreed_flags",
    "chat_template_fields",
    "first_prompt",
    "flags_from_args",
    "flags_from_snapshot",
    "regime_of",
    "serving_endpoints",
]


def _engine_kv_tokens(snapshot: VllmMetricsSnapshot) -> int | None:
    """KV tokens the engine holds, from cache_config_info (None when it does not say)."""
    cache = snapshot.cache_config
    if cache is None or not cache.num_gpu_blocks or not cache.block_size:
        return None
    return cache.num_gpu_blocks * cache.block_size
